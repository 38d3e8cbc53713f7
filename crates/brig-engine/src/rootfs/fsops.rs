//! Descriptor-level helpers shared by the rootfs operations.

use std::fs::File;
use std::mem::MaybeUninit;
use std::ops::ControlFlow;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::fs::{
    AtFlags, FileType, Mode, OFlags, RawDir, ResolveFlags, SeekFrom, StatxAttributes, StatxFlags,
};
use rustix::io::Errno;

/// How API paths are resolved from the sandbox's root: `..` stops at the
/// root, absolute symlinks restart from it, magic links are refused.
pub(super) const IN_ROOT: ResolveFlags = ResolveFlags::IN_ROOT.union(ResolveFlags::NO_MAGICLINKS);

/// How names below a directory the daemon already holds are resolved when
/// they must not go anywhere else (archive entries, a recursive walk): no
/// symlink at all, no `..` out.
pub(super) const BENEATH: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS);

/// A directory to resolve from or act in with `*at()` calls; never read.
pub(super) const PATH_DIR: OFlags = OFlags::PATH.union(OFlags::DIRECTORY).union(OFlags::CLOEXEC);

/// A directory to list.
pub(super) const READ_DIR: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::CLOEXEC);

/// Permission bits, as in `rwx`.
pub(super) const R: u32 = 4;
pub(super) const X: u32 = 1;

/// openat2 in a session's root, tried again on EAGAIN (see `brig_jail::resolve`).
pub(super) fn openat2<P: AsRef<[u8]>>(
    dir: BorrowedFd<'_>,
    path: P,
    flags: OFlags,
    resolve: ResolveFlags,
) -> Result<OwnedFd, Errno> {
    brig_jail::resolve::openat2(dir, path.as_ref(), flags, Mode::empty(), resolve)
}

/// What identifies an inode as reached through one mount.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct NodeId {
    mnt: u64,
    dev: (u32, u32),
    ino: u64,
}

/// The fields of `statx` the operations use.
#[derive(Debug, Clone, Copy)]
pub(super) struct Info {
    pub file_type: FileType,
    /// `st_mode & 0o7777`.
    pub perm: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub mtime: i64,
    pub mtime_nsec: u32,
    pub id: NodeId,
    /// The root of a mount (a mount point seen from its parent).
    pub mount_root: bool,
}

impl Info {
    pub fn is_dir(&self) -> bool {
        self.file_type == FileType::Directory
    }
}

const STATX_MASK: StatxFlags = StatxFlags::BASIC_STATS.union(StatxFlags::MNT_ID);

fn info(st: &rustix::fs::Statx) -> Info {
    Info {
        file_type: FileType::from_raw_mode(u32::from(st.stx_mode)),
        perm: u32::from(st.stx_mode) & 0o7777,
        uid: st.stx_uid,
        gid: st.stx_gid,
        size: st.stx_size,
        mtime: st.stx_mtime.tv_sec,
        mtime_nsec: st.stx_mtime.tv_nsec,
        id: NodeId {
            mnt: st.stx_mnt_id,
            dev: (st.stx_dev_major, st.stx_dev_minor),
            ino: st.stx_ino,
        },
        // STATX_ATTR_MOUNT_ROOT exists since Linux 5.8; brig needs 5.12.
        mount_root: st.stx_attributes_mask.contains(StatxAttributes::MOUNT_ROOT)
            && st.stx_attributes.contains(StatxAttributes::MOUNT_ROOT),
    }
}

/// `name` in `dir`, never following a symlink there.
pub(super) fn stat_at<P: AsRef<[u8]>>(dir: BorrowedFd<'_>, name: P) -> Result<Info, Errno> {
    let st = rustix::fs::statx(dir, name.as_ref(), AtFlags::SYMLINK_NOFOLLOW, STATX_MASK)?;
    Ok(info(&st))
}

/// [`stat_at`], `None` when there is nothing by that name.
pub(super) fn stat_at_opt<P: AsRef<[u8]>>(
    dir: BorrowedFd<'_>,
    name: P,
) -> Result<Option<Info>, Errno> {
    match stat_at(dir, name) {
        Ok(info) => Ok(Some(info)),
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

/// What `fd` (any kind, `O_PATH` included) refers to.
pub(super) fn stat_fd(fd: BorrowedFd<'_>) -> Result<Info, Errno> {
    let st = rustix::fs::statx(fd, "", AtFlags::EMPTY_PATH, STATX_MASK)?;
    Ok(info(&st))
}

/// The name of the kernel filesystem `fd` is on, if it is one (see
/// [`brig_jail::resolve::kernel_fs`]).
pub(super) fn kernel_fs(fd: BorrowedFd<'_>) -> Result<Option<&'static str>, Errno> {
    brig_jail::resolve::kernel_fs(fd)
}

/// Whether the sandbox's user (host ids `owner`) has the `want` permission
/// bits on `info`, by its mode bits as the kernel would check them for a
/// process with that uid, that gid, no supplementary groups and no
/// capabilities. The owner of a file may always: it could chmod it. ACLs are
/// not consulted (they could only be stricter than the group bits, or grant
/// named users, which brig does not set up).
pub(super) fn permits(info: &Info, owner: (u32, u32), want: u32) -> bool {
    if info.uid == owner.0 {
        return true;
    }
    let bits = if info.gid == owner.1 {
        (info.perm >> 3) & 7
    } else {
        info.perm & 7
    };
    bits & want == want
}

/// Bytes of directory entries one `getdents` call fills: room for 14 of the
/// longest names (an entry of a 255-byte name takes 280). A walk holds one
/// such buffer per level it is in, whatever the size of the directories.
const DIR_BUFFER: usize = 4096;

/// Why [`each_name`] stopped before the end of the directory.
pub(super) enum Stopped<E> {
    /// Reading the directory failed.
    Listing(Errno),
    /// `each` failed.
    By(E),
}

/// Calls `each` with every name in the directory `dir` (open for reading),
/// without `.` and `..`, from its start, until `each` breaks or fails. Names
/// are read a buffer at a time, never held: a directory of a million names
/// costs what one of ten does. `dir`'s offset moves, which no `*at()` call
/// cares about. A name added or removed meanwhile may or may not be seen;
/// every other is seen once.
pub(super) fn each_name<E>(
    dir: BorrowedFd<'_>,
    mut each: impl FnMut(&[u8]) -> Result<ControlFlow<()>, E>,
) -> Result<(), Stopped<E>> {
    rustix::fs::seek(dir, SeekFrom::Start(0)).map_err(Stopped::Listing)?;
    let mut buffer = vec![MaybeUninit::uninit(); DIR_BUFFER];
    let mut names = RawDir::new(dir, &mut buffer);
    while let Some(entry) = names.next() {
        let entry = match entry {
            Ok(entry) => entry,
            // The directory was removed while read: it has no names left.
            Err(Errno::NOENT) => break,
            Err(e) => return Err(Stopped::Listing(e)),
        };
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        if each(name).map_err(Stopped::By)?.is_break() {
            break;
        }
    }
    Ok(())
}

/// Up to `limit` names in the directory `dir` (which must be open for
/// reading), without `.` and `..`; the flag says whether more were left.
pub(super) fn read_names(dir: BorrowedFd<'_>, limit: usize) -> Result<(Vec<Vec<u8>>, bool), Errno> {
    let mut names = Vec::new();
    let mut more = false;
    let read = each_name(dir, |name| {
        if names.len() >= limit {
            more = true;
            return Ok::<_, std::convert::Infallible>(ControlFlow::Break(()));
        }
        names.push(name.to_vec());
        Ok(ControlFlow::Continue(()))
    });
    match read {
        Ok(()) => Ok((names, more)),
        Err(Stopped::Listing(e)) => Err(e),
        Err(Stopped::By(never)) => match never {},
    }
}

/// Opens the regular file `name` in `parent` for reading, checking first with
/// an `O_PATH` descriptor (whose open has no effect on the file) that it is a
/// regular file, on an ordinary filesystem, that `check` accepts. The real open
/// then must reach the same inode, so a swap in between is caught.
pub(super) fn open_regular(
    parent: BorrowedFd<'_>,
    name: &[u8],
    check: &dyn Fn(&Info) -> Result<(), OpenRefusal>,
) -> Result<(File, Info), OpenRefusal> {
    for _ in 0..3 {
        let probe = openat2(
            parent,
            name,
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            BENEATH,
        )
        .map_err(OpenRefusal::Errno)?;
        let info = stat_fd(probe.as_fd()).map_err(OpenRefusal::Errno)?;
        if info.file_type != FileType::RegularFile {
            return Err(OpenRefusal::NotRegular(info.file_type));
        }
        if let Some(fs) = kernel_fs(probe.as_fd()).map_err(OpenRefusal::Errno)? {
            return Err(OpenRefusal::KernelFs(fs));
        }
        check(&info)?;
        // O_NONBLOCK|O_NOCTTY: if the name became a fifo or a tty since the
        // probe, opening it neither blocks nor takes a controlling terminal.
        let fd = openat2(
            parent,
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
            BENEATH,
        )
        .map_err(|e| match e {
            // Where the probe resolved: the open would break a lease, and
            // O_NONBLOCK spares the thread the kernel's wait for it to go.
            Errno::WOULDBLOCK => OpenRefusal::Leased,
            e => OpenRefusal::Errno(e),
        })?;
        let opened = stat_fd(fd.as_fd()).map_err(OpenRefusal::Errno)?;
        if opened.id != info.id {
            continue;
        }
        rustix::fs::fcntl_setfl(&fd, OFlags::empty()).map_err(OpenRefusal::Errno)?;
        return Ok((File::from(fd), opened));
    }
    Err(OpenRefusal::Changing)
}

/// Why [`open_regular`] did not open.
#[derive(Debug)]
pub(super) enum OpenRefusal {
    Errno(Errno),
    NotRegular(FileType),
    KernelFs(&'static str),
    Denied,
    /// The name kept pointing at another inode between probe and open.
    Changing,
    /// A process holds a lease on the file (`fcntl(F_SETLEASE)`) that opening
    /// it breaks: the kernel signals the holder and, without `O_NONBLOCK`, lets
    /// the open wait until it lets go or `lease-break-time` (45 s) has passed.
    Leased,
}

pub(super) fn kind_name(file_type: FileType) -> &'static str {
    match file_type {
        FileType::RegularFile => "a regular file",
        FileType::Directory => "a directory",
        FileType::Symlink => "a symlink",
        FileType::Fifo => "a fifo",
        FileType::Socket => "a socket",
        FileType::CharacterDevice => "a character device",
        FileType::BlockDevice => "a block device",
        _ => "not a regular file",
    }
}
