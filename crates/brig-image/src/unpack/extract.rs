//! One layer's tar stream to a directory tree in the overlayfs layer format.
//!
//! OCI whiteouts become what overlayfs itself writes: `.wh.NAME` a 0:0
//! character device `NAME`, `.wh..wh..opq` the xattr `user.overlay.opaque=y`
//! on its directory (`user.`, because brig mounts overlay with `userxattr`
//! inside the sandbox's user namespace).

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, BufReader, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::fs::{AtFlags, FileType, Gid, Mode, OFlags, Timespec, Timestamps, Uid, XattrFlags};
use tar::EntryType;

use super::beneath::{self, WalkError};
use super::compress::Sniffed;
use super::digest::{Digest, Hashing};
use super::{read_error, within, Counting};
use crate::{ImageError, IoContext, Progress, Result};

const WHITEOUT_PREFIX: &[u8] = b".wh.";
/// `.wh..wh..opq` with the whiteout prefix already taken off.
const OPAQUE_MARKER: &[u8] = b".wh..opq";
const OPAQUE_XATTR: &str = "user.overlay.opaque";
/// Longer paths could not be used inside the sandbox anyway, and the bound
/// keeps recursion over a hostile tree's depth in check.
const MAX_PATH: usize = 4096;
const CHUNK: usize = 128 * 1024;
const EPOCH: Timespec = Timespec {
    tv_sec: 0,
    tv_nsec: 0,
};

/// Extracts one (possibly gzip/zstd-compressed) tar stream into `dest` (an
/// existing empty dir), converting whiteouts.
///
/// Nothing is ever written outside `dest`: entries that are absolute, contain
/// `..` or go through a symlink fail with [`ImageError::PathEscape`]. A
/// corrupt or truncated stream fails with [`ImageError::BadSource`]; `dest`
/// then holds part of the layer and is the caller's to remove.
pub fn extract_layer(reader: impl Read, dest: &Path, progress: &dyn Progress) -> Result<()> {
    let mut reader = reader;
    extract(&mut reader, dest, progress).map(drop)
}

/// [`extract_layer`], returning the layer's diff_id: the digest of the
/// uncompressed tar stream, which image configs record for each layer.
pub(crate) fn extract(raw: &mut dyn Read, dest: &Path, progress: &dyn Progress) -> Result<Digest> {
    // `dest` is the caller's path and trusted; only what is below it is not.
    let root = rustix::fs::open(
        dest,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .context(|| format!("opening {}", dest.display()))?;

    let counted = BufReader::with_capacity(CHUNK, Counting::new(raw, progress));
    let decoder = Sniffed::new(counted)?
        .decoder()
        .context(|| "starting the decompressor".to_string())?;
    let mut stream = TarStream {
        inner: Hashing::new(decoder),
        eof: false,
    };
    // The root's metadata is the layer's "/" unless the archive lists `./`:
    // readable by all, whatever the umask made of the staging directory.
    rustix::fs::fchmod(&root, Mode::from_bits_truncate(beneath::IMPLICIT_DIR_MODE))
        .context(|| format!("setting the mode of {}", dest.display()))?;
    let mut layer = Layer {
        root,
        dir_times: BTreeMap::from([(Vec::new(), EPOCH)]),
        buf: vec![0; CHUNK],
        progress,
    };
    {
        let mut archive = tar::Archive::new(&mut stream);
        for entry in archive.entries().map_err(read_error)? {
            if progress.cancelled() {
                return Err(ImageError::Interrupted);
            }
            layer.add(&mut entry.map_err(read_error)?)?;
        }
    }
    if stream.eof {
        return Err(ImageError::BadSource(
            "the tar stream ends without an end-of-archive marker (truncated?)".into(),
        ));
    }
    // The zero blocks after the end marker are part of what the diff_id
    // covers, and reading a compressed stream to its end checks its trailer.
    super::drain(&mut stream, &mut layer.buf, progress)?;
    layer.finish()?;
    Ok(stream.inner.digest())
}

/// The uncompressed tar stream. The tar crate takes EOF where a header should
/// be as a normal end of archive, so a stream truncated between two entries
/// would pass as complete; a well-formed archive ends with a zero block, which
/// the tar crate stops at without reading further.
struct TarStream<R> {
    inner: Hashing<R>,
    eof: bool,
}

impl<R: Read> Read for TarStream<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n == 0 && !buf.is_empty() {
            self.eof = true;
        }
        Ok(n)
    }
}

/// The layer being written.
struct Layer<'p> {
    root: OwnedFd,
    /// Directory mtimes, set last because creating entries inside a directory
    /// changes its mtime. Keyed by `/`-joined path ("" is the root).
    dir_times: BTreeMap<Vec<u8>, Timespec>,
    buf: Vec<u8>,
    progress: &'p dyn Progress,
}

/// What the tar header says about an entry's inode.
struct Meta {
    uid: Uid,
    gid: Gid,
    mode: Mode,
    mtime: Timespec,
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

impl Meta {
    fn times(&self) -> Timestamps {
        Timestamps {
            last_access: self.mtime,
            last_modification: self.mtime,
        }
    }
}

impl Layer<'_> {
    fn add<R: Read>(&mut self, entry: &mut tar::Entry<'_, R>) -> Result<()> {
        let raw = entry.path_bytes().into_owned();
        let shown = String::from_utf8_lossy(&raw).into_owned();
        let mut kind = entry.header().entry_type();
        if kind == EntryType::XGlobalHeader {
            return Ok(());
        }
        // Pre-POSIX archives mark directories with a trailing slash only.
        if kind == EntryType::Regular && raw.ends_with(b"/") {
            kind = EntryType::Directory;
        }
        let path = split_path(&raw).map_err(|problem| problem.at(&shown, None))?;
        let Some((&name, parents)) = path.split_last() else {
            return self.root_entry(kind, entry, &shown);
        };
        if let Some(hidden) = name.strip_prefix(WHITEOUT_PREFIX) {
            return self.whiteout(parents, hidden, entry, &shown);
        }
        let parent = self.parent(parents, &shown)?;
        let parent = parent.as_fd();
        let key = path.join(&b'/');
        match kind {
            EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse => {
                self.file(parent, name, &key, entry, &shown)
            }
            EntryType::Directory => self.directory(parent, name, &key, entry, &shown),
            EntryType::Symlink => self.symlink(parent, name, &key, entry, &shown),
            EntryType::Link => self.hardlink(parent, name, &path, entry, &shown),
            EntryType::Char | EntryType::Block | EntryType::Fifo => {
                self.node(parent, name, &key, kind, entry, &shown)
            }
            other => Err(bad(
                &shown,
                format!(
                    "unsupported tar entry type '{}'",
                    other.as_byte().escape_ascii()
                ),
            )),
        }
    }

    /// `./` in most archives: the layer root's own metadata.
    fn root_entry<R: Read>(
        &mut self,
        kind: EntryType,
        entry: &mut tar::Entry<'_, R>,
        shown: &str,
    ) -> Result<()> {
        if kind != EntryType::Directory {
            return Err(bad(shown, "names the layer root but is not a directory"));
        }
        let meta = read_meta(entry, shown)?;
        set_meta(self.root.as_fd(), &meta, shown)?;
        self.dir_times.insert(Vec::new(), meta.mtime);
        Ok(())
    }

    /// Opens the parent directory of an entry, creating missing ones.
    fn parent(&mut self, parents: &[&[u8]], shown: &str) -> Result<OwnedFd> {
        let mut created = Vec::new();
        let fd = beneath::walk(self.root.as_fd(), parents, Some(&mut |i| created.push(i)))
            .map_err(|e| walk_error(e, parents, shown, None))?;
        // Unlisted directories get a fixed time rather than the time of the
        // import, so that importing twice gives the same tree.
        for i in created {
            self.dir_times.insert(parents[..=i].join(&b'/'), EPOCH);
        }
        Ok(fd)
    }

    fn whiteout<R: Read>(
        &mut self,
        parents: &[&[u8]],
        hidden: &[u8],
        entry: &mut tar::Entry<'_, R>,
        shown: &str,
    ) -> Result<()> {
        let parent = self.parent(parents, shown)?;
        if hidden == OPAQUE_MARKER {
            return rustix::fs::fsetxattr(&parent, OPAQUE_XATTR, b"y", XattrFlags::empty())
                .context(|| format!("marking the directory of '{shown}' opaque"));
        }
        if hidden.starts_with(WHITEOUT_PREFIX) {
            // Other AUFS bookkeeping (.wh..wh.plnk, .wh..wh.aufs) means nothing
            // to overlayfs; docker skips it too.
            tracing::debug!(entry = shown, "skipping AUFS metadata entry");
            return Ok(());
        }
        match hidden {
            b"" | b"." => return Err(bad(shown, "whiteout without a name")),
            b".." => return Err(escape(shown, "whiteout of '..'")),
            _ => {}
        }
        let key = [parents, &[hidden]].concat().join(&b'/');
        self.clear(parent.as_fd(), hidden, &key, false, shown)?;
        // What overlayfs creates for a deleted file: a 0:0 char device, mode 0.
        rustix::fs::mknodat(
            &parent,
            hidden,
            FileType::CharacterDevice,
            Mode::empty(),
            rustix::fs::makedev(0, 0),
        )
        .context(|| format!("creating the whiteout for '{shown}'"))?;
        // The digest covers its mtime: the entry's, not the import's time, so that
        // importing an archive twice gives the same layer.
        let mtime = read_meta(entry, shown)?.times();
        rustix::fs::utimensat(&parent, hidden, &mtime, AtFlags::SYMLINK_NOFOLLOW)
            .context(|| format!("setting the time of the whiteout for '{shown}'"))
    }

    /// Makes room for a new `name`: tar semantics, a later entry replaces an
    /// earlier one. Returns whether an existing directory was kept.
    fn clear(
        &mut self,
        parent: BorrowedFd<'_>,
        name: &[u8],
        key: &[u8],
        keep_dir: bool,
        shown: &str,
    ) -> Result<bool> {
        let existing =
            beneath::file_type(parent, name).context(|| format!("inspecting '{shown}'"))?;
        match existing {
            None => Ok(false),
            Some(FileType::Directory) if keep_dir => Ok(true),
            Some(FileType::Directory) => {
                beneath::remove_tree(parent, name)
                    .context(|| format!("replacing directory '{shown}'"))?;
                let mut below = key.to_vec();
                below.push(b'/');
                self.dir_times
                    .retain(|k, _| k.as_slice() != key && !k.starts_with(&below));
                Ok(false)
            }
            Some(_) => {
                rustix::fs::unlinkat(parent, name, AtFlags::empty())
                    .context(|| format!("replacing '{shown}'"))?;
                Ok(false)
            }
        }
    }

    fn file<R: Read>(
        &mut self,
        parent: BorrowedFd<'_>,
        name: &[u8],
        key: &[u8],
        entry: &mut tar::Entry<'_, R>,
        shown: &str,
    ) -> Result<()> {
        let meta = read_meta(entry, shown)?;
        self.clear(parent, name, key, false, shown)?;
        // O_EXCL on a name just cleared: the data can only land in a new inode,
        // never in an existing file or through a link.
        let fd = brig_sys::resolve::openat2(
            parent,
            name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_bits_truncate(0o600),
            beneath::RESOLVE,
        )
        .context(|| format!("creating '{shown}'"))?;
        let mut file = File::from(fd);
        let expected = entry.size();
        let (mut written, mut ends_in_hole) = (0u64, false);
        loop {
            if self.progress.cancelled() {
                return Err(ImageError::Interrupted);
            }
            let n = entry
                .read(&mut self.buf)
                .map_err(|e| within(&format!("entry '{shown}'"), read_error(e)))?;
            if n == 0 {
                break;
            }
            ends_in_hole =
                brig_sys::sparse::write_keeping_holes(&mut file, &self.buf[..n], written)
                    .context(|| format!("writing '{shown}'"))?;
            written += n as u64;
        }
        if written != expected {
            return Err(bad(
                shown,
                format!("archive truncated after {written} of {expected} bytes"),
            ));
        }
        // A file that ends in a hole has its size only once it is set.
        if ends_in_hole {
            file.set_len(written)
                .context(|| format!("writing '{shown}'"))?;
        }
        set_meta(file.as_fd(), &meta, shown)?;
        rustix::fs::futimens(&file, &meta.times())
            .context(|| format!("setting the times of '{shown}'"))
    }

    fn directory<R: Read>(
        &mut self,
        parent: BorrowedFd<'_>,
        name: &[u8],
        key: &[u8],
        entry: &mut tar::Entry<'_, R>,
        shown: &str,
    ) -> Result<()> {
        let meta = read_meta(entry, shown)?;
        // A directory listed again only updates its metadata: its contents
        // (and an opaque marker) stay.
        if !self.clear(parent, name, key, true, shown)? {
            rustix::fs::mkdirat(parent, name, Mode::from_bits_truncate(0o700))
                .context(|| format!("creating directory '{shown}'"))?;
        }
        let dir = beneath::open_dir(parent, name).context(|| format!("opening '{shown}'"))?;
        set_meta(dir.as_fd(), &meta, shown)?;
        self.dir_times.insert(key.to_vec(), meta.mtime);
        Ok(())
    }

    fn symlink<R: Read>(
        &mut self,
        parent: BorrowedFd<'_>,
        name: &[u8],
        key: &[u8],
        entry: &mut tar::Entry<'_, R>,
        shown: &str,
    ) -> Result<()> {
        let meta = read_meta(entry, shown)?;
        // The target may point anywhere: it is only ever resolved inside the
        // sandbox. Extraction never follows it (see `beneath`).
        let target = entry
            .link_name_bytes()
            .map(|t| t.into_owned())
            .filter(|t| !t.is_empty() && !t.contains(&0))
            .ok_or_else(|| bad(shown, "symlink without a valid target"))?;
        self.clear(parent, name, key, false, shown)?;
        rustix::fs::symlinkat(target.as_slice(), parent, name)
            .context(|| format!("creating symlink '{shown}'"))?;
        set_meta_at(parent, name, &meta, FileType::Symlink, shown)
    }

    fn hardlink<R: Read>(
        &mut self,
        parent: BorrowedFd<'_>,
        name: &[u8],
        path: &[&[u8]],
        entry: &mut tar::Entry<'_, R>,
        shown: &str,
    ) -> Result<()> {
        let raw = entry
            .link_name_bytes()
            .map(|t| t.into_owned())
            .ok_or_else(|| bad(shown, "hard link without a target"))?;
        let target_shown = String::from_utf8_lossy(&raw).into_owned();
        let role = format!("hard link target '{target_shown}'");
        let target = split_path(&raw).map_err(|problem| problem.at(shown, Some(&role)))?;
        if target == path {
            return Ok(());
        }
        let Some((&target_name, target_parents)) = target.split_last() else {
            return Err(bad(shown, "hard link to the layer root"));
        };
        let target_parent = beneath::walk(self.root.as_fd(), target_parents, None)
            .map_err(|e| walk_error(e, target_parents, shown, Some(&role)))?;
        let not_here = || bad(shown, format!("{role} is not earlier in this layer"));
        match beneath::file_type(target_parent.as_fd(), target_name)
            .context(|| format!("inspecting {role} of '{shown}'"))?
        {
            None => return Err(not_here()),
            Some(FileType::Directory) => return Err(bad(shown, format!("{role} is a directory"))),
            Some(_) => {}
        }
        self.clear(parent, name, &path.join(&b'/'), false, shown)?;
        // No AT_SYMLINK_FOLLOW: a link to a symlink links the symlink itself.
        match rustix::fs::linkat(&target_parent, target_name, parent, name, AtFlags::empty()) {
            // Clearing `name` removed the target (it was below `name`).
            Err(rustix::io::Errno::NOENT) => Err(not_here()),
            other => other.context(|| format!("creating hard link '{shown}'")),
        }
    }

    fn node<R: Read>(
        &mut self,
        parent: BorrowedFd<'_>,
        name: &[u8],
        key: &[u8],
        kind: EntryType,
        entry: &mut tar::Entry<'_, R>,
        shown: &str,
    ) -> Result<()> {
        let meta = read_meta(entry, shown)?;
        let header = entry.header();
        let number = |n: io::Result<Option<u32>>| {
            n.map(Option::unwrap_or_default)
                .map_err(|e| bad(shown, format!("bad device number: {e}")))
        };
        // Writers leave the device fields blank for fifos.
        let (file_type, dev) = match kind {
            EntryType::Char | EntryType::Block => {
                let dev = rustix::fs::makedev(
                    number(header.device_major())?,
                    number(header.device_minor())?,
                );
                let file_type = if kind == EntryType::Char {
                    FileType::CharacterDevice
                } else {
                    FileType::BlockDevice
                };
                (file_type, dev)
            }
            _ => (FileType::Fifo, 0),
        };
        self.clear(parent, name, key, false, shown)?;
        rustix::fs::mknodat(parent, name, file_type, meta.mode, dev)
            .context(|| format!("creating '{shown}'"))?;
        set_meta_at(parent, name, &meta, file_type, shown)
    }

    fn finish(&self) -> Result<()> {
        for (path, mtime) in &self.dir_times {
            let shown = String::from_utf8_lossy(path);
            let dir = beneath::open_dir(self.root.as_fd(), path)
                .context(|| format!("opening directory '{shown}'"))?;
            let times = Timestamps {
                last_access: *mtime,
                last_modification: *mtime,
            };
            rustix::fs::futimens(&dir, &times)
                .context(|| format!("setting the times of '{shown}'"))?;
        }
        Ok(())
    }
}

/// Metadata for what cannot be opened: symlinks, and devices and fifos,
/// whose open has side effects (or blocks).
fn set_meta_at(
    parent: BorrowedFd<'_>,
    name: &[u8],
    meta: &Meta,
    file_type: FileType,
    shown: &str,
) -> Result<()> {
    rustix::fs::chownat(
        parent,
        name,
        Some(meta.uid),
        Some(meta.gid),
        AtFlags::SYMLINK_NOFOLLOW,
    )
    .context(|| format!("setting the owner of '{shown}'"))?;
    if file_type != FileType::Symlink {
        // After chown, which clears set-id bits; also undoes mknod's umask.
        rustix::fs::chmodat(parent, name, meta.mode, AtFlags::empty())
            .context(|| format!("setting the mode of '{shown}'"))?;
    }
    for (xattr, value) in &meta.xattrs {
        // The kernel refuses user.* xattrs on anything but files and
        // directories.
        if xattr.starts_with(b"user.") {
            tracing::debug!(entry = shown, "skipping user xattr on a special file");
            continue;
        }
        beneath::set_xattr_nofollow(parent, name, xattr, value).context(|| {
            format!(
                "setting xattr {} on '{shown}'",
                String::from_utf8_lossy(xattr)
            )
        })?;
    }
    rustix::fs::utimensat(parent, name, &meta.times(), AtFlags::SYMLINK_NOFOLLOW)
        .context(|| format!("setting the times of '{shown}'"))
}

/// Owner, then mode (chown clears set-id bits), then xattrs (writing the
/// data or chown would drop `security.capability`).
fn set_meta(fd: BorrowedFd<'_>, meta: &Meta, shown: &str) -> Result<()> {
    rustix::fs::fchown(fd, Some(meta.uid), Some(meta.gid))
        .context(|| format!("setting the owner of '{shown}'"))?;
    rustix::fs::fchmod(fd, meta.mode).context(|| format!("setting the mode of '{shown}'"))?;
    for (xattr, value) in &meta.xattrs {
        rustix::fs::fsetxattr(fd, OsStr::from_bytes(xattr), value, XattrFlags::empty()).context(
            || {
                format!(
                    "setting xattr {} on '{shown}'",
                    String::from_utf8_lossy(xattr)
                )
            },
        )?;
    }
    Ok(())
}

fn read_meta<R: Read>(entry: &mut tar::Entry<'_, R>, shown: &str) -> Result<Meta> {
    let header = entry.header();
    let field = |what: &str, e: io::Error| bad(shown, format!("bad {what} in the tar header: {e}"));
    let mode = header.mode().map_err(|e| field("mode", e))?;
    // The tar crate already applies pax uid/gid overrides.
    let uid = id(header.uid().map_err(|e| field("uid", e))?, "uid", shown)?;
    let gid = id(header.gid().map_err(|e| field("gid", e))?, "gid", shown)?;
    let seconds = header.mtime().map_err(|e| field("mtime", e))?;
    let mut mtime = Timespec {
        tv_sec: i64::try_from(seconds).map_err(|_| bad(shown, "mtime out of range"))?,
        tv_nsec: 0,
    };
    let mut xattrs = Vec::new();
    if let Some(extensions) = entry.pax_extensions().map_err(read_error)? {
        for extension in extensions {
            let extension = extension.map_err(|e| bad(shown, format!("bad pax header: {e}")))?;
            let key = extension.key_bytes();
            // GNU tar's sparse files in the pax format (--sparse with --format=pax):
            // the tar crate reads them as their raw map and pieces, so the file would
            // come out wrong. The GNU format's sparse files are read right.
            if key.starts_with(b"GNU.sparse.") {
                return Err(bad(
                    shown,
                    "a sparse file in the pax format (GNU tar --sparse --format=pax) is not \
                     supported: make the archive with --format=gnu, or without --sparse",
                ));
            }
            if key == b"mtime" {
                mtime = parse_pax_time(extension.value_bytes())
                    .ok_or_else(|| bad(shown, "bad mtime in the pax header"))?;
            } else if let Some(xattr) = key.strip_prefix(b"SCHILY.xattr.") {
                if xattr.is_empty() || xattr.contains(&0) {
                    return Err(bad(shown, "bad xattr name in the pax header"));
                }
                // overlayfs metadata comes only from whiteout conversion: an
                // archive's own (redirects, metacopy, origin...) would steer
                // overlayfs' lookups across layers.
                if xattr.starts_with(b"user.overlay.") || xattr.starts_with(b"trusted.overlay.") {
                    tracing::debug!(entry = shown, "dropping archived overlayfs xattr");
                    continue;
                }
                // Nor what the layer's digest does not cover (trusted.*, SELinux
                // labels, IMA hashes...): layers are shared by digest, so a first
                // archive must not decide what later ones with the same content get.
                if !crate::tree::is_content_xattr(OsStr::from_bytes(xattr)) {
                    tracing::debug!(entry = shown, "dropping archived xattr outside the digest");
                    continue;
                }
                xattrs.push((xattr.to_vec(), extension.value_bytes().to_vec()));
            }
        }
    }
    Ok(Meta {
        uid: Uid::from_raw(uid),
        gid: Gid::from_raw(gid),
        mode: Mode::from_bits_truncate(mode & 0o7777),
        mtime,
        xattrs,
    })
}

/// -1 means "leave unchanged" to chown, so it cannot be an owner.
fn id(value: u64, what: &str, shown: &str) -> Result<u32> {
    u32::try_from(value)
        .ok()
        .filter(|&v| v != u32::MAX)
        .ok_or_else(|| bad(shown, format!("{what} {value} is out of range")))
}

/// A pax time: decimal seconds with an optional fraction, maybe negative.
fn parse_pax_time(value: &[u8]) -> Option<Timespec> {
    let text = std::str::from_utf8(value).ok()?;
    let (negative, digits) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (whole, fraction) = digits.split_once('.').unwrap_or((digits, ""));
    if whole.is_empty() || !(whole.bytes().chain(fraction.bytes())).all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut seconds: i64 = whole.parse().ok()?;
    // Nanoseconds from the first nine fraction digits, right-padded.
    let mut nanos: i64 = format!("{:0<9}", &fraction[..fraction.len().min(9)])
        .parse()
        .ok()?;
    if negative {
        seconds = -seconds;
        if nanos > 0 {
            seconds -= 1;
            nanos = 1_000_000_000 - nanos;
        }
    }
    Some(Timespec {
        tv_sec: seconds,
        // `c_long` on some targets; below 10^9 either way.
        tv_nsec: nanos as _,
    })
}

/// Why an archive path is refused.
#[derive(Debug, PartialEq, Eq)]
enum PathProblem {
    Absolute,
    DotDot,
    TooLong,
    Nul,
}

impl PathProblem {
    /// The error for entry `shown`; `role` names the path when it is not the
    /// entry's own (a hard link's target).
    fn at(self, shown: &str, role: Option<&str>) -> ImageError {
        let whose = role.unwrap_or("path");
        match self {
            PathProblem::Absolute => escape(shown, format!("{whose} is absolute")),
            PathProblem::DotDot => escape(shown, format!("{whose} contains '..'")),
            PathProblem::TooLong => bad(shown, format!("{whose} is longer than {MAX_PATH} bytes")),
            PathProblem::Nul => bad(shown, format!("{whose} contains a NUL byte")),
        }
    }
}

/// The components of an archive path, without empty and `.` ones (so a
/// leading `./` is fine); an empty list is the layer root.
fn split_path(raw: &[u8]) -> Result<Vec<&[u8]>, PathProblem> {
    if raw.len() > MAX_PATH {
        return Err(PathProblem::TooLong);
    }
    if raw.contains(&0) {
        return Err(PathProblem::Nul);
    }
    if raw.starts_with(b"/") {
        return Err(PathProblem::Absolute);
    }
    let mut components = Vec::new();
    for component in raw.split(|&b| b == b'/') {
        match component {
            b"" | b"." => {}
            b".." => return Err(PathProblem::DotDot),
            _ => components.push(component),
        }
    }
    Ok(components)
}

fn walk_error(err: WalkError, components: &[&[u8]], shown: &str, role: Option<&str>) -> ImageError {
    let prefix = |i: usize| String::from_utf8_lossy(&components[..=i].join(&b'/')).into_owned();
    let role = role.map(|r| format!("{r}: ")).unwrap_or_default();
    match err {
        WalkError::Symlink(i) => escape(
            shown,
            format!("{role}goes through the symlink '{}'", prefix(i)),
        ),
        WalkError::NotDir(i) => bad(shown, format!("{role}'{}' is not a directory", prefix(i))),
        WalkError::Missing(i) => bad(
            shown,
            format!("{role}'{}' is not earlier in this layer", prefix(i)),
        ),
        WalkError::Io(i, e) => ImageError::io(
            format!("entry '{shown}': {role}opening directory '{}'", prefix(i)),
            e,
        ),
    }
}

fn escape(shown: &str, reason: impl Into<String>) -> ImageError {
    ImageError::PathEscape {
        entry: shown.to_string(),
        reason: reason.into(),
    }
}

fn bad(shown: &str, message: impl std::fmt::Display) -> ImageError {
    ImageError::BadSource(format!("entry '{shown}': {message}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_split_into_plain_components() {
        assert_eq!(
            split_path(b"./a//b/./c/").unwrap(),
            vec![&b"a"[..], b"b", b"c"]
        );
        assert!(split_path(b"./").unwrap().is_empty());
        assert!(split_path(b"").unwrap().is_empty());
        assert_eq!(split_path(b"/etc/passwd"), Err(PathProblem::Absolute));
        assert_eq!(split_path(b"a/../../b"), Err(PathProblem::DotDot));
        assert_eq!(split_path(b".."), Err(PathProblem::DotDot));
        assert_eq!(split_path(b"a\0b"), Err(PathProblem::Nul));
        assert_eq!(split_path(&[b'a'; MAX_PATH + 1]), Err(PathProblem::TooLong));
        // Only whole components named `..` climb.
        assert_eq!(split_path(b"a/..b/c..").unwrap().len(), 3);
    }

    #[test]
    fn pax_times() {
        let t = |s: &str| parse_pax_time(s.as_bytes()).map(|t| (t.tv_sec, t.tv_nsec));
        assert_eq!(t("1700000000"), Some((1_700_000_000, 0)));
        assert_eq!(t("1700000000.5"), Some((1_700_000_000, 500_000_000)));
        assert_eq!(t("12.1234567891234"), Some((12, 123_456_789)));
        assert_eq!(t("-1.25"), Some((-2, 750_000_000)));
        assert_eq!(t("abc"), None);
        assert_eq!(t(".5"), None);
        assert_eq!(t("1e9"), None);
    }

    #[test]
    fn ids_that_chown_would_misread_are_refused() {
        assert_eq!(id(0, "uid", "x").unwrap(), 0);
        assert_eq!(id(65534, "uid", "x").unwrap(), 65534);
        assert!(id(u64::from(u32::MAX), "uid", "x").is_err());
        assert!(id(1 << 40, "gid", "x").is_err());
    }
}
