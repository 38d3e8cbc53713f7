//! Filling a new sandbox's /tmp and /workspace from a snapshot of another sandbox's
//! (`Filesystem::seed`): a layer mount whose `tmp/` and `workspace/` hold what those
//! scratch directories held.
//!
//! Init does it after joining the cgroup (the tmpfs pages are the sandbox's, charged
//! to its memory) and before anything of the sandbox runs, as the sandbox user: what
//! it creates is that user's, and the scratch tmpfs's size (the disk limit) bounds
//! it. A snapshot that does not fit fails the start ([`JailError::DiskFull`], or
//! [`JailError::MemoryFull`] when the memory limit is the smaller: init is then
//! usually OOM-killed, which the supervisor reports as that); the sandbox is then
//! torn down whole, so no half-filled sandbox is ever handed out.
//!
//! The snapshot's content came from untrusted code, so nothing in it is followed:
//! both trees are walked through directory descriptors one component at a time
//! with `O_NOFOLLOW`, and new entries are made with `O_EXCL`, `mkdirat` and
//! `symlinkat`, none of which follows a symlink at the last component. A symlink
//! (`evil -> /etc/shadow`, `up -> ../../..`) is recreated as a symlink and only ever
//! resolved later, inside the sandbox. What brig already placed in the new sandbox
//! wins: an existing entry is a mount point of the plan (a bundle bound below
//! /workspace), left alone with nothing copied into or below it.
//!
//! Kept: regular files, directories and symlinks, with their modes (less set-id
//! bits) and modification times. Hard links become separate files; fifos, sockets
//! and devices are skipped (the sandbox could not have made devices anyway). Cost:
//! proportional to the snapshot's size (one read of every byte, one write of every
//! block that is not all zeros: holes, and blocks of zeros, stay holes).

use std::os::fd::{AsFd, OwnedFd};

use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags, Stat, Timespec, Timestamps};
use rustix::io::Errno;

use crate::fsplan::{FsOp, FsPlan, ScratchDir};
use crate::JailError;

/// Directory levels below /tmp or /workspace followed (two descriptors each).
const MAX_DEPTH: usize = 512;
/// Set-id bits are not carried over: what the sandbox writes never gets them.
const MODE_MASK: u32 = 0o1777;
const CHUNK: usize = 1 << 20;

/// Copies the seed's `tmp/` and `workspace/` into the scratch directories the plan
/// mounted at their paths. A directory missing from the seed is left empty.
pub(crate) fn fill(seed: &OwnedFd, plan: &FsPlan) -> Result<(), JailError> {
    let filling = Filling {
        disk_bytes: plan.scratch_bytes,
        buf: std::cell::RefCell::new(vec![0; CHUNK]),
    };
    for op in &plan.ops {
        let FsOp::Scratch { dir, path } = op else {
            continue;
        };
        if *dir == ScratchDir::Shm {
            continue;
        }
        let source = match open_dir(seed, dir.name()) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => continue,
            Err(e) => return Err(filling.error(e, "open the snapshot's", dir.name())),
        };
        let target = rustix::fs::open(
            path.as_str(),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| filling.error(e, "open", path))?;
        filling.copy_tree(source, target, path)?;
    }
    Ok(())
}

struct Filling {
    disk_bytes: u64,
    /// One copy buffer for every file (init's memory is the sandbox's).
    buf: std::cell::RefCell<Vec<u8>>,
}

/// A directory being copied: its entries still to read and where they go.
struct Frame {
    source: Dir,
    target: OwnedFd,
    target_dev: u64,
    /// Its sandbox path, for messages.
    path: String,
    /// Set once its entries are in: a directory without write permission must
    /// still take them first.
    mode: Mode,
    times: Timestamps,
}

impl Filling {
    fn copy_tree(&self, source: OwnedFd, target: OwnedFd, path: &str) -> Result<(), JailError> {
        let stat = rustix::fs::fstat(&source).map_err(|e| self.error(e, "inspect", path))?;
        let target_dev = rustix::fs::fstat(&target)
            .map_err(|e| self.error(e, "inspect", path))?
            .st_dev;
        let mut stack = vec![Frame {
            source: Dir::new(source).map_err(|e| self.error(e, "read", path))?,
            target,
            target_dev,
            path: path.to_string(),
            mode: mode_of(&stat),
            times: times_of(&stat),
        }];
        loop {
            let depth = stack.len();
            let Some(frame) = stack.last_mut() else {
                break;
            };
            let entry = match frame.source.next() {
                None => {
                    let done = stack.pop().expect("the frame just read");
                    rustix::fs::fchmod(&done.target, done.mode)
                        .and_then(|()| rustix::fs::futimens(&done.target, &done.times))
                        .map_err(|e| self.error(e, "set the mode and times of", &done.path))?;
                    continue;
                }
                Some(entry) => entry.map_err(|e| self.error(e, "read", &frame.path))?,
            };
            let name = entry.file_name();
            if name == c"." || name == c".." {
                continue;
            }
            let path = format!("{}/{}", frame.path, name.to_string_lossy());
            let target_dev = frame.target_dev;
            let source_dir = frame
                .source
                .fd()
                .map_err(|e| self.error(e, "read", &path))?;
            let stat = rustix::fs::statat(source_dir, name, AtFlags::SYMLINK_NOFOLLOW)
                .map_err(|e| self.error(e, "inspect the snapshot's", &path))?;
            match FileType::from_raw_mode(stat.st_mode) {
                FileType::Directory => {
                    let Some(target) = self.make_dir(frame, name, &path)? else {
                        continue;
                    };
                    if depth >= MAX_DEPTH {
                        return Err(JailError::Setup(format!(
                            "{path}: the snapshot nests directories deeper than {MAX_DEPTH} levels"
                        )));
                    }
                    let source =
                        open_dir(source_dir, name).map_err(|e| self.error(e, "open", &path))?;
                    stack.push(Frame {
                        source: Dir::new(source).map_err(|e| self.error(e, "read", &path))?,
                        target,
                        target_dev,
                        path,
                        mode: mode_of(&stat),
                        times: times_of(&stat),
                    });
                }
                FileType::RegularFile => self.copy_file(source_dir, frame, name, &stat, &path)?,
                FileType::Symlink => {
                    let link = rustix::fs::readlinkat(source_dir, name, Vec::new())
                        .map_err(|e| self.error(e, "read the symlink", &path))?;
                    match rustix::fs::symlinkat(link.as_c_str(), &frame.target, name) {
                        Ok(()) => {}
                        Err(Errno::EXIST) => continue,
                        Err(e) => return Err(self.error(e, "create the symlink", &path)),
                    }
                    rustix::fs::utimensat(
                        &frame.target,
                        name,
                        &times_of(&stat),
                        AtFlags::SYMLINK_NOFOLLOW,
                    )
                    .map_err(|e| self.error(e, "set the times of", &path))?;
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The directory `name` in the frame's target, made if missing; `None` if what
    /// is there is not a directory of this tmpfs (a mount point: left alone).
    fn make_dir(
        &self,
        frame: &Frame,
        name: &std::ffi::CStr,
        path: &str,
    ) -> Result<Option<OwnedFd>, JailError> {
        let made = match rustix::fs::mkdirat(&frame.target, name, Mode::from_raw_mode(0o700)) {
            Ok(()) => true,
            Err(Errno::EXIST) => false,
            Err(e) => return Err(self.error(e, "create", path)),
        };
        let target = match open_dir(&frame.target, name) {
            Ok(fd) => fd,
            Err(Errno::NOTDIR | Errno::LOOP) if !made => return Ok(None),
            Err(e) => return Err(self.error(e, "open", path)),
        };
        if !made {
            let dev = rustix::fs::fstat(&target)
                .map_err(|e| self.error(e, "inspect", path))?
                .st_dev;
            if dev != frame.target_dev {
                return Ok(None);
            }
        }
        Ok(Some(target))
    }

    fn copy_file(
        &self,
        source_dir: impl AsFd,
        frame: &Frame,
        name: &std::ffi::CStr,
        stat: &Stat,
        path: &str,
    ) -> Result<(), JailError> {
        let source = rustix::fs::openat(
            source_dir,
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| self.error(e, "open the snapshot's", path))?;
        let target = match rustix::fs::openat(
            &frame.target,
            name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        ) {
            Ok(fd) => fd,
            // A file brig bound there: it stays.
            Err(Errno::EXIST) => return Ok(()),
            Err(e) => return Err(self.error(e, "create", path)),
        };
        // Holes stay holes: a snapshot of a sparse file (the layer packs its zeros
        // into almost nothing) must not come back as that many bytes of tmpfs.
        let mut target = std::fs::File::from(target);
        let (mut copied, mut ends_in_hole) = (0u64, false);
        let mut buf = self.buf.borrow_mut();
        loop {
            let n = match rustix::io::read(&source, &mut buf[..]) {
                Ok(0) => break,
                Ok(n) => n,
                Err(Errno::INTR) => continue,
                Err(e) => return Err(self.error(e, "read the snapshot's", path)),
            };
            ends_in_hole = crate::sparse::write_keeping_holes(&mut target, &buf[..n], copied)
                .map_err(|e| self.io_error(e, "write", path))?;
            copied += n as u64;
        }
        if ends_in_hole {
            target
                .set_len(copied)
                .map_err(|e| self.io_error(e, "write", path))?;
        }
        rustix::fs::fchmod(&target, mode_of(stat))
            .and_then(|()| rustix::fs::futimens(&target, &times_of(stat)))
            .map_err(|e| self.error(e, "set the mode and times of", path))
    }

    fn io_error(&self, e: std::io::Error, what: &str, path: &str) -> JailError {
        match e.raw_os_error() {
            Some(raw) => self.error(Errno::from_raw_os_error(raw), what, path),
            None => JailError::sys(format!("fill from the snapshot: {what} {path}"), e),
        }
    }

    fn error(&self, e: Errno, what: &str, path: &str) -> JailError {
        if e == Errno::NOSPC || e == Errno::DQUOT {
            return JailError::DiskFull(format!(
                "the snapshot's files do not fit in the sandbox's disk of {} bytes (full at {path})",
                self.disk_bytes
            ));
        }
        // Its tmpfs pages are charged to the sandbox's memory: a write the memory
        // limit refuses (rather than an OOM kill, see the supervisor) is that.
        if e == Errno::NOMEM {
            return JailError::MemoryFull(format!(
                "the snapshot's files do not fit in the sandbox's memory (full at {path})"
            ));
        }
        JailError::sys(
            format!("fill from the snapshot: {what} {path}"),
            std::io::Error::from_raw_os_error(e.raw_os_error()),
        )
    }
}

fn open_dir(parent: impl AsFd, name: impl rustix::path::Arg) -> Result<OwnedFd, Errno> {
    rustix::fs::openat(
        parent,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

fn mode_of(stat: &Stat) -> Mode {
    Mode::from_raw_mode(stat.st_mode & MODE_MASK)
}

fn times_of(stat: &Stat) -> Timestamps {
    Timestamps {
        last_access: Timespec {
            tv_sec: stat.st_atime,
            tv_nsec: stat.st_atime_nsec as _,
        },
        last_modification: Timespec {
            tv_sec: stat.st_mtime,
            tv_nsec: stat.st_mtime_nsec as _,
        },
    }
}
