//! `openat2` as every caller in brig needs it, and the kernel filesystems no
//! operation of the host's on a sandbox's files may read or write.
//!
//! With `RESOLVE_BENEATH` or `RESOLVE_IN_ROOT`, the kernel answers EAGAIN when a
//! rename or a mount anywhere on the host races with a `..` it resolves: it cannot
//! then tell that the `..` stayed inside. The man page asks the caller to try again.
//! Without that, opening a path of an image with `..` in a symlink failed at random
//! whenever other sandboxes were being set up (`brig: open /etc/hostname: Resource
//! temporarily unavailable`).

use std::os::fd::{AsFd, OwnedFd};

use rustix::fs::{Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

/// Tries this often before giving EAGAIN back: each try fails only if a rename or
/// mount happened during it.
const RETRIES: usize = 64;

/// `openat2(dir, path, flags, mode, resolve)`, tried again on EAGAIN and EINTR.
pub fn openat2<P: rustix::path::Arg + Copy>(
    dir: impl AsFd,
    path: P,
    flags: OFlags,
    mode: Mode,
    resolve: ResolveFlags,
) -> Result<OwnedFd, Errno> {
    let dir = dir.as_fd();
    let mut last = Errno::AGAIN;
    for _ in 0..RETRIES {
        match rustix::fs::openat2(dir, path, flags, mode, resolve) {
            Err(e @ (Errno::AGAIN | Errno::INTR)) => last = e,
            other => return other,
        }
    }
    Err(last)
}

/// Kernel filesystems whose files are interfaces to the kernel, not data: the
/// daemon runs as host root with every capability, so reading or writing them
/// for a sandbox (its procfs shows `/proc/<pid>/mem` and `environ` of the
/// non-dumpable init; a writable cgroupfs or sysfs would reconfigure the
/// host) would lend it privileges it does not have. Values from
/// `<linux/magic.h>`.
const KERNEL_FILESYSTEMS: &[(u32, &str)] = &[
    (0x9fa0, "proc"),
    (0x6265_6572, "sysfs"),
    (0x0027_e0eb, "cgroup"),
    (0x6367_7270, "cgroup2"),
    (0x6462_6720, "debugfs"),
    (0x7472_6163, "tracefs"),
    (0x7363_6673, "securityfs"),
    (0xcafe_4a11, "bpf"),
    (0x6265_6570, "configfs"),
    (0x6165_676c, "pstore"),
    (0xde5e_81e4, "efivarfs"),
    (0xf97c_ff8c, "selinuxfs"),
    (0x4341_5d53, "smackfs"),
    (0x4249_4e4d, "binfmt_misc"),
    (0x0000_1cd1, "devpts"),
    (0x6573_5543, "fusectl"),
    (0x6e73_6673, "nsfs"),
];

/// The name of the kernel filesystem `fd` is on, if it is one of those.
pub fn kernel_fs(fd: std::os::fd::BorrowedFd<'_>) -> Result<Option<&'static str>, Errno> {
    let st = rustix::fs::fstatfs(fd)?;
    // `f_type` is a C long on most targets; magics are 32-bit values.
    #[allow(clippy::unnecessary_cast)]
    let magic = st.f_type as u64 as u32;
    Ok(KERNEL_FILESYSTEMS
        .iter()
        .find(|(m, _)| *m == magic)
        .map(|(_, name)| *name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// Resolves `a/../b` beneath a directory while another thread mounts and
    /// unmounts elsewhere; returns how many tries failed with EAGAIN, raw or retried.
    fn race(open: impl Fn(&OwnedFd) -> Result<OwnedFd, Errno>) -> usize {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("a")).unwrap();
        std::fs::write(dir.path().join("b"), "b").unwrap();
        let mnt = tempfile::tempdir().unwrap();
        let root = rustix::fs::open(
            dir.path(),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .unwrap();
        let stop = AtomicBool::new(false);
        std::thread::scope(|scope| {
            scope.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    rustix::mount::mount(
                        "tmpfs",
                        mnt.path(),
                        "tmpfs",
                        rustix::mount::MountFlags::empty(),
                        None,
                    )
                    .unwrap();
                    rustix::mount::unmount(mnt.path(), rustix::mount::UnmountFlags::empty())
                        .unwrap();
                }
            });
            let failed = (0..200_000)
                .filter(|_| matches!(open(&root), Err(Errno::AGAIN)))
                .count();
            stop.store(true, Ordering::Relaxed);
            failed
        })
    }

    #[test]
    fn a_dotdot_resolved_while_mounts_race_is_tried_again() {
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped: mounting needs root");
            return;
        }
        let flags = OFlags::RDONLY | OFlags::CLOEXEC;
        let raw = race(|root| {
            rustix::fs::openat2(root, "a/../b", flags, Mode::empty(), ResolveFlags::BENEATH)
        });
        let retried =
            race(|root| openat2(root, "a/../b", flags, Mode::empty(), ResolveFlags::BENEATH));
        eprintln!("EAGAIN: {raw} raw, {retried} retried");
        assert_eq!(retried, 0);
    }
}
