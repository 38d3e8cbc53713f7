//! Fixed-size filesystems in image files: what caps a daemon volume's writes.
//!
//! A directory on the host's filesystem cannot be capped while a sandbox writes to
//! it (project quotas depend on the host's filesystem and its mount options). An
//! ext4 filesystem in a sparse image file can: the sandbox gets ENOSPC at its
//! capacity, the host loses at most that much disk, and the file only takes what is
//! written (deletes punch holes through `discard`).
//!
//! One image is only ever mounted through one loop device: two read-write ext4
//! instances on one file would corrupt it. [`mount`] reuses the device that already
//! backs the image (a sandbox may keep its filesystem alive after the host's mount
//! is gone) and attaches a new one only when there is none; mounts in one process
//! are serialized. Two processes must not mount one image (the daemon's data dir is
//! its own).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsFd;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use rustix::mount::{MountFlags, UnmountFlags};

use crate::loopdev::LoopDevice;

/// Held while looking for an image's device and mounting it, and while unmounting:
/// two threads mounting one image at once could each find no device and attach one.
static MOUNTING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The smallest filesystem [`format`] makes (ext4 with a journal needs a few MiB).
pub const MIN_SIZE: u64 = 16 << 20;

/// Creates `image` (which must not exist) as a sparse file of `size` bytes holding
/// an empty ext4 filesystem whose root is root's, mode 0755. Uses `mkfs.ext4` from
/// e2fsprogs: no maintained Rust crate writes ext4.
pub fn format(image: &Path, size: u64) -> io::Result<()> {
    if size < MIN_SIZE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("a disk needs at least {MIN_SIZE} bytes"),
        ));
    }
    use std::os::unix::fs::OpenOptionsExt;
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(image)?;
    file.set_len(size)?;
    drop(file);
    let output = Command::new(mkfs())
        .args(["-q", "-F", "-t", "ext4", "-m", "0", "-L", "brig-volume"])
        // Inode tables and journal are left for the kernel to initialize lazily
        // (and `noinit_itable` makes it never do it in the background): the sparse
        // file starts at well under a MiB.
        .args([
            "-E",
            "root_owner=0:0,lazy_itable_init=1,lazy_journal_init=1,nodiscard",
        ])
        .arg(image)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output();
    let failure = match output {
        Ok(out) if out.status.success() => None,
        Ok(out) => Some(io::Error::other(format!(
            "mkfs.ext4 failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))),
        Err(e) => Some(io::Error::new(
            e.kind(),
            format!("cannot run mkfs.ext4 (install e2fsprogs): {e}"),
        )),
    };
    if let Some(e) = failure {
        let _ = std::fs::remove_file(image);
        return Err(e);
    }
    Ok(())
}

/// Where `mkfs.ext4` is: /usr/sbin or /sbin (a daemon started from a user's shell
/// may lack them in its PATH), else the PATH.
fn mkfs() -> &'static str {
    for candidate in ["/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4"] {
        if Path::new(candidate).exists() {
            return candidate;
        }
    }
    "mkfs.ext4"
}

/// Whether [`format`] can work here: `mkfs.ext4` is installed.
pub fn can_format() -> bool {
    let found = mkfs();
    found.starts_with('/')
        || std::env::var_os("PATH")
            .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(found).is_file()))
}

/// Whether `path` is the root of a mount (statx's STATX_ATTR_MOUNT_ROOT).
pub fn is_mount_root(path: &Path) -> io::Result<bool> {
    use rustix::fs::{statx, AtFlags, StatxAttributes, StatxFlags, CWD};
    let stat = statx(
        CWD,
        path,
        AtFlags::SYMLINK_NOFOLLOW,
        StatxFlags::BASIC_STATS,
    )?;
    Ok(stat.stx_attributes.contains(StatxAttributes::MOUNT_ROOT))
}

/// Mounts the filesystem in `image` at `mount_point` (`nosuid,nodev`), unless it is
/// mounted there already. Never gives one image two loop devices.
pub fn mount(image: &Path, mount_point: &Path) -> io::Result<()> {
    let _serialized = MOUNTING.lock().unwrap_or_else(|e| e.into_inner());
    if is_mount_root(mount_point)? {
        return Ok(());
    }
    let backing = OpenOptions::new().read(true).write(true).open(image)?;
    let flags = MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOATIME;
    // `discard`: what is deleted inside is freed in the image file too.
    let options = c"discard,noinit_itable,errors=remount-ro";
    // A device found may be running down (its last mount just went): then it
    // refuses to open, and a moment later it is gone and a new one is safe.
    for _ in 0..50 {
        let Some(existing) = LoopDevice::find(&backing)? else {
            return mount_new(&backing, image, mount_point, flags, options);
        };
        match rustix::mount::mount(&existing, mount_point, "ext4", flags, options) {
            Ok(()) => return Ok(()),
            Err(rustix::io::Errno::NXIO | rustix::io::Errno::NODEV) => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => {
                return Err(io::Error::new(
                    io::Error::from(e).kind(),
                    format!("mount {} from {}: {e}", image.display(), existing.display()),
                ))
            }
        }
    }
    Err(io::Error::other(format!(
        "the loop device of {} did not go away",
        image.display()
    )))
}

fn mount_new(
    backing: &File,
    image: &Path,
    mount_point: &Path,
    flags: MountFlags,
    options: &std::ffi::CStr,
) -> io::Result<()> {
    let device = LoopDevice::attach(backing.as_fd(), false)?;
    if let Err(e) = rustix::mount::mount(&device.path, mount_point, "ext4", flags, options) {
        let path = device.path.clone();
        // Not mounted, so autoclear will never fire: detach now.
        let _ = device.detach();
        return Err(io::Error::new(
            io::Error::from(e).kind(),
            format!("mount {} from {}: {e}", image.display(), path.display()),
        ));
    }
    // The mount holds the device; autoclear releases it when the filesystem goes.
    Ok(())
}

/// Detaches the mount at `mount_point` if there is one. Sandboxes holding their own
/// clone of it keep the filesystem (and its loop device) until they end.
pub fn unmount(mount_point: &Path) -> io::Result<()> {
    let _serialized = MOUNTING.lock().unwrap_or_else(|e| e.into_inner());
    match is_mount_root(mount_point) {
        Ok(true) => rustix::mount::unmount(mount_point, UnmountFlags::DETACH).map_err(Into::into),
        Ok(false) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Bytes in use in the filesystem mounted at `mount_point` (df's "Used": data and
/// directories, delayed allocations included, the filesystem's fixed overhead not).
pub fn used(mount_point: &Path) -> io::Result<u64> {
    let stat = rustix::fs::statvfs(mount_point)?;
    Ok(stat.f_blocks.saturating_sub(stat.f_bfree) * stat.f_frsize)
}

/// Bytes the image file takes on the host's disk (it is sparse).
pub fn allocated(image: &Path) -> io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    Ok(std::fs::metadata(image)?.blocks() * 512)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn is_root() -> bool {
        rustix::process::geteuid().is_root()
    }

    #[test]
    fn a_disk_caps_writes_keeps_data_and_shares_one_device() {
        if !is_root() {
            eprintln!("skipped: needs root (loop devices, mounts)");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("disk");
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::create_dir(&a).unwrap();
        std::fs::create_dir(&b).unwrap();
        // Unmounted also when an assertion fails, so that the directory goes.
        struct Unmount(Vec<std::path::PathBuf>);
        impl Drop for Unmount {
            fn drop(&mut self) {
                for path in &self.0 {
                    let _ = unmount(path);
                }
            }
        }
        let _unmount = Unmount(vec![a.clone(), b.clone()]);
        assert!(format(&image, MIN_SIZE - 1).is_err());
        assert!(!image.exists());
        format(&image, MIN_SIZE).unwrap();
        assert!(format(&image, MIN_SIZE).is_err(), "formatted over a disk");
        assert!(allocated(&image).unwrap() < 4 << 20, "not sparse");

        mount(&image, &a).unwrap();
        mount(&image, &a).unwrap();
        assert!(is_mount_root(&a).unwrap());
        let empty = used(&a).unwrap();
        assert!(empty < 1 << 20, "{empty}");
        // A second mount point gets the same filesystem, never a second device.
        mount(&image, &b).unwrap();
        use std::os::unix::fs::MetadataExt;
        let dev = |p: &Path| std::fs::metadata(p).unwrap().dev();
        assert_eq!(dev(&a), dev(&b));
        std::fs::write(a.join("kept"), "kept").unwrap();
        assert_eq!(std::fs::read_to_string(b.join("kept")).unwrap(), "kept");
        // With the first mount gone and another holder left (a sandbox's clone),
        // mounting again finds that filesystem's device.
        unmount(&a).unwrap();
        mount(&image, &a).unwrap();
        assert_eq!(dev(&a), dev(&b));
        // Counted at once, before the data reaches the image.
        std::fs::write(a.join("mib"), vec![1u8; 1 << 20]).unwrap();
        assert!(used(&a).unwrap() >= empty + (1 << 20));
        std::fs::remove_file(a.join("mib")).unwrap();

        // Writing past the capacity fails with ENOSPC; the image stays within it.
        let mut big = File::create(a.join("big")).unwrap();
        let chunk = vec![1u8; 1 << 20];
        let err = (0..64)
            .find_map(|_| big.write_all(&chunk).and_then(|()| big.sync_all()).err())
            .expect("wrote 64 MiB into a 16 MiB disk");
        assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
        drop(big);
        assert!(allocated(&image).unwrap() <= MIN_SIZE);
        // Deleting frees the space in the image file too (discard).
        std::fs::remove_file(a.join("big")).unwrap();
        rustix::fs::sync();
        unmount(&a).unwrap();
        unmount(&a).unwrap();
        assert!(!is_mount_root(&a).unwrap());
        unmount(&b).unwrap();
        assert!(
            allocated(&image).unwrap() < 8 << 20,
            "{}",
            allocated(&image).unwrap()
        );

        // Mounted again later: the data is there, and the old device was released.
        let backing = File::open(&image).unwrap();
        let released = (0..200).any(|_| {
            std::thread::sleep(Duration::from_millis(10));
            LoopDevice::find(&backing).unwrap().is_none()
        });
        assert!(released, "the loop device outlived its mounts");
        mount(&image, &a).unwrap();
        assert_eq!(std::fs::read_to_string(a.join("kept")).unwrap(), "kept");
        assert!(LoopDevice::find(&backing).unwrap().is_some());
        unmount(&a).unwrap();
    }
}
