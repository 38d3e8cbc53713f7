//! A sandbox directory as a tar stream.
//!
//! The archive holds the directory's contents with names relative to it
//! (`a`, `a/b`, `sub/`): regular files, directories and symlinks (stored as
//! symlinks, never followed); fifos, sockets and devices are left out, and a
//! directory's entries come in its own order (a listing sorted first would be
//! held whole). The walk holds one descriptor and one buffer of names per
//! level, and opens every name below the directory with `O_NOFOLLOW` and
//! `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`, so a symlink planted mid-walk is
//! at worst archived as a symlink. It crosses into other mounts (a bundle
//! bound below `/workspace` is part of what the sandbox sees), except kernel
//! filesystems, which are left out. What the sandbox's user could not read is
//! left out too.
//!
//! Data is streamed through the tar crate's copy buffer: a file is never held
//! in memory. Owners are not recorded (uid/gid 0): host ids mean nothing to
//! the client. A file that shrinks while archived is padded with zeros and
//! one that grows is cut at the size its header declared, so the archive
//! stays well-formed.

use std::ffi::OsStr;
use std::io::{self, Read, Write};
use std::ops::ControlFlow;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::fs::{FileType, Mode};
use rustix::io::Errno;
use tar::{EntryType, Header};

use super::error::{errno, show};
use super::fsops::{self, Info, OpenRefusal, Stopped, BENEATH, R, READ_DIR, X};
use super::{path, RootfsError, SandboxRoot, MAX_DEPTH, MAX_DIR_ENTRIES};

pub(super) fn write_tar<W: Write>(
    root: &SandboxRoot,
    dir: &str,
    out: W,
) -> Result<(), RootfsError> {
    path::check(dir)?;
    let shown = show(dir.as_bytes());
    let top = root.open_dir(dir, &shown)?;
    root.check_listable(top.as_fd(), &shown)?;
    let reader = rustix::fs::openat(&top, ".", READ_DIR, Mode::empty())
        .map_err(|e| errno(e, "opening", &shown))?;
    let mut walk = Walk {
        root,
        builder: tar::Builder::new(out),
        top: dir.trim_end_matches('/').as_bytes().to_vec(),
        rel: Vec::new(),
    };
    walk.dir(reader.as_fd(), 0)?;
    // Writes the end-of-archive blocks.
    walk.builder
        .into_inner()
        .map(drop)
        .map_err(|e| RootfsError::io(format!("writing the archive of {shown}"), e))
}

struct Walk<'a, W: Write> {
    root: &'a SandboxRoot,
    builder: tar::Builder<W>,
    /// The archived directory's sandbox path without trailing slashes
    /// (empty for `/`), for messages.
    top: Vec<u8>,
    /// The current entry's name in the archive.
    rel: Vec<u8>,
}

impl<W: Write> Walk<'_, W> {
    /// The sandbox path of the current entry, for messages.
    fn shown(&self) -> String {
        if self.top.is_empty() && self.rel.is_empty() {
            return "/".to_string();
        }
        let mut full = self.top.clone();
        if !self.rel.is_empty() {
            full.push(b'/');
            full.extend_from_slice(&self.rel);
        }
        show(&full)
    }

    fn dir(&mut self, dir: BorrowedFd<'_>, depth: usize) -> Result<(), RootfsError> {
        if depth >= MAX_DEPTH {
            return Err(RootfsError::TooLarge(format!(
                "{}: nested more than {MAX_DEPTH} directories deep",
                self.shown()
            )));
        }
        // In the directory's own order, a buffer of names at a time: a listing
        // held whole would stay in the daemon's memory for as long as the client
        // takes to read the archive (35 MiB for 120,000 long names), per download.
        let mut seen = 0;
        fsops::each_name(dir, |name| {
            seen += 1;
            if seen > MAX_DIR_ENTRIES {
                return Err(RootfsError::TooLarge(format!(
                    "{}: more than {MAX_DIR_ENTRIES} entries in one directory",
                    self.shown()
                )));
            }
            let len = self.rel.len();
            if len > 0 {
                self.rel.push(b'/');
            }
            self.rel.extend_from_slice(name);
            let result = self.entry(dir, name, depth);
            self.rel.truncate(len);
            result.map(|()| ControlFlow::Continue(()))
        })
        .map_err(|stopped| match stopped {
            Stopped::Listing(e) => errno(e, "listing", &self.shown()),
            Stopped::By(e) => e,
        })
    }

    fn entry(&mut self, dir: BorrowedFd<'_>, name: &[u8], depth: usize) -> Result<(), RootfsError> {
        let info = match fsops::stat_at(dir, name) {
            Ok(info) => info,
            // Removed by the sandbox since it was listed.
            Err(Errno::NOENT) => return Ok(()),
            Err(e) => return Err(errno(e, "inspecting", &self.shown())),
        };
        match info.file_type {
            FileType::Directory => self.subdir(dir, name, depth),
            FileType::RegularFile => self.file(dir, name),
            FileType::Symlink => self.symlink(dir, name, &info),
            _ => {
                tracing::debug!(path = %self.shown(), "not archiving a special file");
                Ok(())
            }
        }
    }

    fn subdir(
        &mut self,
        dir: BorrowedFd<'_>,
        name: &[u8],
        depth: usize,
    ) -> Result<(), RootfsError> {
        let sub = match fsops::openat2(dir, name, READ_DIR | rustix::fs::OFlags::NOFOLLOW, BENEATH)
        {
            Ok(sub) => sub,
            // Changed since the stat: not a directory any more.
            Err(Errno::NOENT | Errno::LOOP | Errno::NOTDIR) => return Ok(()),
            Err(e) => return Err(errno(e, "opening", &self.shown())),
        };
        match fsops::kernel_fs(sub.as_fd()) {
            Ok(None) => {}
            Ok(Some(fs)) => {
                tracing::debug!(path = %self.shown(), fs, "not archiving a kernel filesystem");
                return Ok(());
            }
            Err(e) => return Err(errno(e, "inspecting", &self.shown())),
        }
        let info =
            fsops::stat_fd(sub.as_fd()).map_err(|e| errno(e, "inspecting", &self.shown()))?;
        if !fsops::permits(&info, self.root.owner(), R | X) {
            tracing::debug!(path = %self.shown(), "not archiving an unreadable directory");
            return Ok(());
        }
        let mut header = header(&info, EntryType::Directory, 0);
        let mut path = self.rel.clone();
        path.push(b'/');
        self.append(&mut header, &path, io::empty())?;
        self.dir(sub.as_fd(), depth + 1)
    }

    fn file(&mut self, dir: BorrowedFd<'_>, name: &[u8]) -> Result<(), RootfsError> {
        let owner = self.root.owner();
        let check = |info: &Info| {
            if fsops::permits(info, owner, R) {
                Ok(())
            } else {
                Err(OpenRefusal::Denied)
            }
        };
        let (file, info) = match fsops::open_regular(dir, name, &check) {
            Ok(opened) => opened,
            Err(OpenRefusal::Errno(Errno::NOENT)) => return Ok(()),
            Err(OpenRefusal::Errno(e)) => return Err(errno(e, "opening", &self.shown())),
            // Not left out: the archive would look whole without it.
            Err(OpenRefusal::Leased) => return Err(super::leased(&self.shown())),
            Err(refusal) => {
                tracing::debug!(path = %self.shown(), ?refusal, "not archiving a file");
                return Ok(());
            }
        };
        let mut header = header(&info, EntryType::Regular, info.size);
        let data = Exact {
            inner: file,
            remaining: info.size,
            eof: false,
        };
        let rel = self.rel.clone();
        self.append(&mut header, &rel, data)
    }

    fn symlink(
        &mut self,
        dir: BorrowedFd<'_>,
        name: &[u8],
        info: &Info,
    ) -> Result<(), RootfsError> {
        let target = match rustix::fs::readlinkat(dir, name, Vec::new()) {
            Ok(target) => target.into_bytes(),
            // Removed, or no longer a symlink, since the stat.
            Err(Errno::NOENT | Errno::INVAL) => return Ok(()),
            Err(e) => return Err(errno(e, "reading the symlink", &self.shown())),
        };
        let mut header = header(info, EntryType::Symlink, 0);
        header.set_mode(0o777);
        let shown = self.shown();
        let fail = |e| RootfsError::io(format!("archiving {shown}"), e);
        // Stored byte for byte: the tar crate's `append_link` would rewrite
        // the target as a path (dropping `.` components, doubled slashes).
        if target.len() <= LINK_FIELD {
            header.set_link_name_literal(&target).map_err(fail)?;
        } else {
            // A GNU long link record, as GNU tar writes it; the header keeps
            // a truncated copy.
            let mut long = Header::new_gnu();
            let marker = b"././@LongLink";
            long.as_old_mut().name[..marker.len()].copy_from_slice(marker);
            long.set_mode(0o644);
            long.set_entry_type(EntryType::GNULongLink);
            long.set_size(target.len() as u64 + 1);
            long.set_cksum();
            let data = io::Cursor::new(&target).chain(&[0u8][..]);
            self.builder.append(&long, data).map_err(fail)?;
            header
                .set_link_name_literal(&target[..LINK_FIELD])
                .map_err(fail)?;
        }
        let rel = self.rel.clone();
        self.append(&mut header, &rel, io::empty())
    }

    /// Appends one entry; the tar crate writes a GNU long name record when
    /// the name does not fit the header.
    fn append(
        &mut self,
        header: &mut Header,
        name: &[u8],
        data: impl Read,
    ) -> Result<(), RootfsError> {
        self.builder
            .append_data(header, Path::new(OsStr::from_bytes(name)), data)
            .map_err(|e| RootfsError::io(format!("archiving {}", self.shown()), e))
    }
}

/// The size of the link name field of a tar header.
const LINK_FIELD: usize = 100;

fn header(info: &Info, kind: EntryType, size: u64) -> Header {
    let mut header = Header::new_gnu();
    header.set_entry_type(kind);
    header.set_size(size);
    header.set_mode(info.perm);
    header.set_mtime(u64::try_from(info.mtime).unwrap_or(0));
    header.set_uid(0);
    header.set_gid(0);
    header
}

/// Exactly `remaining` bytes of `inner`: cut if it has more, zero-padded if
/// it ends early (a file changed by the sandbox while it is archived).
struct Exact<R> {
    inner: R,
    remaining: u64,
    eof: bool,
}

impl<R: Read> Read for Exact<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let want = buf
            .len()
            .min(usize::try_from(self.remaining).unwrap_or(usize::MAX));
        if want == 0 {
            return Ok(0);
        }
        let buf = &mut buf[..want];
        if !self.eof {
            let n = self.inner.read(buf)?;
            if n > 0 {
                self.remaining -= n as u64;
                return Ok(n);
            }
            self.eof = true;
        }
        buf.fill(0);
        self.remaining -= want as u64;
        Ok(want)
    }
}
