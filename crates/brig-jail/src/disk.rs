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
//!
//! A disk can grow, like a cloud disk ([`grow`]): the image file gets longer and
//! the filesystem takes the new room, online while mounted (what sandboxes that
//! have it see at once) or offline. [`format`] makes every filesystem ready for
//! that (4 KiB blocks, descriptor room for its largest size), so growing only ever
//! adds block groups.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use rustix::mount::{MountFlags, UnmountFlags};

use crate::loopdev::LoopDevice;

/// Held while looking for an image's device and mounting it, and while unmounting:
/// two threads mounting one image at once could each find no device and attach one.
static MOUNTING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The smallest filesystem [`format`] makes (ext4 with a journal needs a few MiB).
pub const MIN_SIZE: u64 = 16 << 20;

/// The block size of the filesystems [`format`] makes. mkfs would take 1 KiB for a
/// small one, and then growing it far needs more group descriptors than ext4 can
/// hold without rearranging itself (resize2fs refuses 16 MiB to 1 TiB outright).
const BLOCK_SIZE: u64 = 4096;

/// How long [`grow`] waits for a filesystem it unmounted to let go of its device.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(3);

/// Creates `image` (which must not exist) as a sparse file of `size` bytes holding
/// an empty ext4 filesystem whose root is root's, mode 0755, that [`grow`] can take
/// to `max_size`. Uses `mkfs.ext4` from e2fsprogs: no maintained Rust crate writes
/// ext4.
pub fn format(image: &Path, size: u64, max_size: u64) -> io::Result<()> {
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
    // Inode tables and journal are left for the kernel to initialize lazily (and
    // `noinit_itable` makes it never do it in the background): the sparse file
    // starts at well under a MiB.
    let mut extended =
        String::from("root_owner=0:0,lazy_itable_init=1,lazy_journal_init=1,nodiscard");
    // Descriptor room reserved for `max_size` (half a MiB for 1 TiB): growing then
    // only adds groups. Without it, growing past the room mkfs leaves moves blocks
    // around, which resize2fs 1.47 was seen to abort half-way (16 MiB to 64 GiB),
    // leaving a filesystem to repair.
    let max_blocks = max_size / BLOCK_SIZE;
    if max_blocks > size / BLOCK_SIZE {
        extended.push_str(&format!(",resize={max_blocks}"));
    }
    let block_size = BLOCK_SIZE.to_string();
    let made = run_e2fs(
        "mkfs.ext4",
        &[
            "-q",
            "-F",
            "-t",
            "ext4",
            "-b",
            &block_size,
            "-m",
            "0",
            "-L",
            "brig-volume",
            "-E",
            &extended,
        ],
        image,
        None,
        |code| code == 0,
    );
    if let Err(e) = made {
        let _ = std::fs::remove_file(image);
        return Err(e);
    }
    Ok(())
}

/// Where an e2fsprogs tool is: /usr/sbin or /sbin (a daemon started from a user's
/// shell may lack them in its PATH), else the PATH.
fn e2fs_tool(name: &str) -> PathBuf {
    for dir in ["/usr/sbin", "/sbin"] {
        let candidate = Path::new(dir).join(name);
        if candidate.exists() {
            return candidate;
        }
    }
    PathBuf::from(name)
}

/// Runs e2fsprogs' `name` with `args`, `image`, then `last` if any; an error (with
/// the tool's own message) unless `ok` accepts its exit code.
fn run_e2fs(
    name: &str,
    args: &[&str],
    image: &Path,
    last: Option<&str>,
    ok: impl Fn(i32) -> bool,
) -> io::Result<()> {
    let output = Command::new(e2fs_tool(name))
        .args(args)
        .arg(image)
        .args(last)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot run {name} (install e2fsprogs): {e}"),
            )
        })?;
    match output.status.code() {
        Some(code) if ok(code) => Ok(()),
        _ => {
            // resize2fs says why on stdout, mkfs and e2fsck on stderr.
            let said = [&output.stderr, &output.stdout]
                .iter()
                .map(|out| String::from_utf8_lossy(out).trim().replace('\n', "; "))
                .filter(|text| !text.is_empty())
                .collect::<Vec<_>>()
                .join("; ");
            Err(io::Error::other(format!(
                "{name} failed ({}): {said}",
                output.status
            )))
        }
    }
}

/// Whether [`format`] can work here: `mkfs.ext4` is installed.
pub fn can_format() -> bool {
    let found = e2fs_tool("mkfs.ext4");
    found.is_absolute()
        || std::env::var_os("PATH")
            .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(&found).is_file()))
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
    mount_locked(image, mount_point)
}

/// [`mount`] with `MOUNTING` held.
fn mount_locked(image: &Path, mount_point: &Path) -> io::Result<()> {
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
    unmount_locked(mount_point)
}

/// [`unmount`] with `MOUNTING` held.
fn unmount_locked(mount_point: &Path) -> io::Result<()> {
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

/// EXT4_IOC_RESIZE_FS: grow the mounted filesystem to the given number of blocks.
const EXT4_IOC_RESIZE_FS: rustix::ioctl::Opcode = rustix::ioctl::opcode::write::<u64>(b'f', 16);

/// Why [`grow`] did not grow a disk.
#[derive(Debug)]
pub enum GrowError {
    /// Mounted somewhere else (a sandbox's own mount of it) while this process
    /// cannot grow a mounted filesystem ([`can_grow_online`]). Nothing changed.
    InUse,
    /// The filesystem cannot describe that size (`resize2fs` says why, e.g. one made
    /// with 1 KiB blocks has room for too few group descriptors). Nothing changed.
    TooLarge { reason: String },
    /// Growing failed. `size`: the filesystem's size in bytes as it was left, if it
    /// could be read: what it was, or more if it grew part of the way.
    Failed { error: io::Error, size: Option<u64> },
}

impl std::fmt::Display for GrowError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GrowError::InUse => f.write_str(
                "mounted elsewhere, and growing a mounted filesystem needs CAP_SYS_RESOURCE",
            ),
            GrowError::TooLarge { reason } => f.write_str(reason),
            GrowError::Failed { error, .. } => error.fmt(f),
        }
    }
}

impl From<io::Error> for GrowError {
    fn from(error: io::Error) -> GrowError {
        GrowError::Failed { error, size: None }
    }
}

/// Whether this process may grow a mounted filesystem: ext4's online resize wants
/// CAP_SYS_RESOURCE, which some hosts take even from root (containers, some VMs).
pub fn can_grow_online() -> bool {
    ::caps::has_cap(
        None,
        ::caps::CapSet::Effective,
        ::caps::Capability::CAP_SYS_RESOURCE,
    )
    .unwrap_or(false)
}

/// Grows the filesystem in `image` to `size` bytes, keeping its data. It may be
/// mounted at `mount_point` (by [`mount`]) and in sandboxes, which see the new free
/// space at once, or not mounted at all.
///
/// Online whenever this process may ([`can_grow_online`]): the image file gets
/// longer, its loop device is told (LOOP_SET_CAPACITY), and the kernel grows the
/// mounted filesystem (EXT4_IOC_RESIZE_FS, which is what resize2fs does for a
/// mounted one). That is the robust way: one path whether or not sandboxes use the
/// disk, no unmounting, and the kernel journals each group it adds, so a crash
/// leaves a consistent filesystem, at most partly grown. A disk that is not mounted
/// is mounted for it (and stays mounted, as after a session used it).
///
/// Else offline, which needs nothing mounted anywhere: unmounted here, checked with
/// `e2fsck -f` (resize2fs insists), grown in the image file by `resize2fs`, mounted
/// again if it was. If a sandbox still has it, [`GrowError::InUse`].
///
/// A failure leaves the filesystem usable, at its old size or partly grown (see
/// [`GrowError::Failed`]). The image file may keep its new length: sparse, unused,
/// taken by the next growth. It is cut back only where nothing of the filesystem
/// can lie past the old end.
pub fn grow(image: &Path, mount_point: &Path, size: u64) -> Result<(), GrowError> {
    let _serialized = MOUNTING.lock().unwrap_or_else(|e| e.into_inner());
    if can_grow_online() {
        mount_locked(image, mount_point)?;
        return grow_online(image, mount_point, size);
    }
    let mounted = is_mount_root(mount_point)?;
    if mounted {
        unmount_locked(mount_point)?;
    }
    let grown = if released(image)? {
        grow_offline(image, size)
    } else {
        Err(GrowError::InUse)
    };
    if mounted {
        // Should this fail, the next session that uses the disk mounts it.
        if let Err(e) = mount_locked(image, mount_point) {
            tracing::warn!(image = %image.display(), "cannot mount a disk again after growing it: {e}");
        }
    }
    grown
}

/// Whether no loop device backs `image` (any more): a filesystem just unmounted
/// lets go of its device a moment later.
fn released(image: &Path) -> io::Result<bool> {
    let backing = File::open(image)?;
    let start = std::time::Instant::now();
    loop {
        if LoopDevice::find(&backing)?.is_none() {
            return Ok(true);
        }
        if start.elapsed() > RELEASE_TIMEOUT {
            return Ok(false);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// [`grow`] of a filesystem mounted at `mount_point`.
fn grow_online(image: &Path, mount_point: &Path, size: u64) -> Result<(), GrowError> {
    let backing = OpenOptions::new().read(true).write(true).open(image)?;
    let device = LoopDevice::find(&backing)?.ok_or_else(|| {
        io::Error::other(format!("{} is mounted without a device", image.display()))
    })?;
    // Read through the device: the kernel keeps the live superblock in its cache.
    let (blocks, block_size) = geometry(&device)?;
    let before = Some(blocks * block_size);
    let target = size / block_size;
    if target <= blocks {
        return Ok(());
    }
    let old_len = backing.metadata()?.len();
    if size > old_len {
        backing.set_len(size)?;
    }
    if let Err(error) = LoopDevice::set_capacity(&device) {
        // The device never took the new length: the file can go back.
        let _ = backing.set_len(old_len);
        return Err(GrowError::Failed {
            error,
            size: before,
        });
    }
    // Any file of the filesystem will do.
    let root = File::open(mount_point)?;
    // SAFETY: EXT4_IOC_RESIZE_FS reads one u64, the new block count, through the
    // pointer that Setter passes to its own copy of `target`, which outlives the call.
    let resized = unsafe {
        rustix::ioctl::ioctl(
            &root,
            rustix::ioctl::Setter::<EXT4_IOC_RESIZE_FS, u64>::new(target),
        )
    };
    resized.map_err(|e| GrowError::Failed {
        // The file and the device keep their new length: the kernel may have begun
        // to write the new groups there, and a device cut back under a mounted
        // filesystem can turn it read-only.
        error: io::Error::new(
            io::Error::from(e).kind(),
            format!("resize {} online: {e}", image.display()),
        ),
        size: geometry(&device).ok().map(|(b, bs)| b * bs),
    })
}

/// [`grow`] of a filesystem that nothing has mounted.
fn grow_offline(image: &Path, size: u64) -> Result<(), GrowError> {
    let (blocks, block_size) = geometry(image)?;
    let before = blocks * block_size;
    if size / block_size <= blocks {
        return Ok(());
    }
    // 1: errors corrected, 2: corrected, reboot (for a root filesystem); more: left.
    let check = |image: &Path| run_e2fs("e2fsck", &["-f", "-p"], image, None, |c| c & !3 == 0);
    check(image)?;
    let file = OpenOptions::new().write(true).open(image)?;
    let old_len = file.metadata()?.len();
    if size > old_len {
        file.set_len(size)?;
    }
    let blocks = format!("{}K", size >> 10);
    if let Err(error) = run_e2fs("resize2fs", &[], image, Some(&blocks), |c| c == 0) {
        // resize2fs writes in place, without a journal: repair what it may have left.
        let checked = check(image);
        if let Err(e) = &checked {
            tracing::error!(image = %image.display(), "a disk may be damaged after a failed resize: {e}");
        }
        let now = geometry(image).ok().map(|(b, bs)| b * bs);
        if now == Some(before) {
            // Offline, and the filesystem ends where it did: nothing of it is past there.
            let _ = file.set_len(old_len);
            // Left whole and as it was: resize2fs refused the size itself.
            if let (Ok(()), Some(reason)) = (checked, size_refusal(&error)) {
                return Err(GrowError::TooLarge { reason });
            }
        }
        return Err(GrowError::Failed { error, size: now });
    }
    Ok(())
}

/// resize2fs's reason for refusing a size outright, from its output (as
/// [`run_e2fs`] reports it): the line it prefixes with its name, without the path.
fn size_refusal(error: &io::Error) -> Option<String> {
    const REFUSALS: [&str; 3] = [
        "too many block group descriptors",
        "too large to be expressed in 32 bits",
        "not enough reserved gdt blocks",
    ];
    let said = error.to_string();
    said.split("; ")
        // Prefixed with the program as it was run: `/usr/sbin/resize2fs: ...`.
        .filter_map(|line| line.split_once("resize2fs: ").map(|(_, reason)| reason))
        .find(|reason| {
            let reason = reason.to_ascii_lowercase();
            REFUSALS.iter().any(|r| reason.contains(r))
        })
        .map(|reason| reason.trim_end_matches('.').to_string())
}

/// The ext4 filesystem at the start of `path` (an image or its device): its size in
/// blocks and its block size, from its superblock.
fn geometry(path: &Path) -> io::Result<(u64, u64)> {
    use std::os::unix::fs::FileExt;
    let mut sb = [0u8; 1024];
    File::open(path)?.read_exact_at(&mut sb, 1024)?;
    let u32_at = |at: usize| u32::from_le_bytes([sb[at], sb[at + 1], sb[at + 2], sb[at + 3]]);
    // s_magic, s_log_block_size, s_feature_incompat (64BIT), s_blocks_count_lo/hi.
    let log_block_size = u32_at(0x18);
    if u16::from_le_bytes([sb[0x38], sb[0x39]]) != 0xEF53 || log_block_size > 6 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} holds no ext4 filesystem", path.display()),
        ));
    }
    let mut blocks = u64::from(u32_at(0x04));
    if u32_at(0x60) & 0x80 != 0 {
        blocks |= u64::from(u32_at(0x150)) << 32;
    }
    Ok((blocks, 1024 << log_block_size))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn is_root() -> bool {
        rustix::process::geteuid().is_root()
    }

    /// Unmounts its paths when dropped, also when an assertion fails, so that the
    /// test's directory goes.
    struct Unmount(Vec<std::path::PathBuf>);

    impl Drop for Unmount {
        fn drop(&mut self) {
            for path in &self.0 {
                let _ = unmount(path);
            }
        }
    }

    /// Two empty directories `a` and `b` in `dir`, unmounted when the guard drops.
    fn mount_points(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf, Unmount) {
        let (a, b) = (dir.join("a"), dir.join("b"));
        std::fs::create_dir(&a).unwrap();
        std::fs::create_dir(&b).unwrap();
        let guard = Unmount(vec![a.clone(), b.clone()]);
        (a, b, guard)
    }

    #[test]
    fn a_disk_caps_writes_keeps_data_and_shares_one_device() {
        if !is_root() {
            eprintln!("skipped: needs root (loop devices, mounts)");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("disk");
        let (a, b, _unmount) = mount_points(dir.path());
        assert!(format(&image, MIN_SIZE - 1, 1 << 30).is_err());
        assert!(!image.exists());
        format(&image, MIN_SIZE, 1 << 30).unwrap();
        assert!(
            format(&image, MIN_SIZE, 1 << 30).is_err(),
            "formatted over a disk"
        );
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

    #[test]
    fn a_disk_grows_mounted_or_not_and_keeps_its_data() {
        if !is_root() {
            eprintln!("skipped: needs root (loop devices, mounts)");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("disk");
        let (a, b, _unmount) = mount_points(dir.path());
        let total = |p: &Path| {
            let stat = rustix::fs::statvfs(p).unwrap();
            stat.f_blocks * stat.f_frsize
        };
        let len = |p: &Path| std::fs::metadata(p).unwrap().len();
        let fill = |p: &Path, mib: usize| {
            std::fs::write(p, vec![3u8; mib << 20]).and_then(|()| File::open(p)?.sync_all())
        };
        format(&image, MIN_SIZE, 1 << 30).unwrap();
        mount(&image, &a).unwrap();
        let kept: Vec<u8> = (0..4u32 << 20).map(|i| (i % 251) as u8).collect();
        std::fs::write(a.join("kept"), &kept).unwrap();
        let small = total(&a);
        assert!(small < MIN_SIZE, "{small}");
        assert!(
            fill(&a.join("big"), 16).is_err(),
            "16 MiB fit in a 16 MiB disk"
        );
        std::fs::remove_file(a.join("big")).unwrap();

        // Also mounted elsewhere (as a sandbox has it): grown online, or, where this
        // process may not, refused with nothing changed.
        mount(&image, &b).unwrap();
        match grow(&image, &a, 64 << 20) {
            Ok(()) => {
                assert!(can_grow_online());
                assert!(total(&b) > 48 << 20, "{}", total(&b));
                fill(&b.join("big"), 32).unwrap();
                std::fs::remove_file(b.join("big")).unwrap();
            }
            Err(GrowError::InUse) => {
                assert!(!can_grow_online());
                eprintln!("online growth not tested: this process lacks CAP_SYS_RESOURCE");
                assert_eq!(len(&image), MIN_SIZE);
                assert_eq!(total(&b), small);
                assert!(is_mount_root(&a).unwrap(), "left unmounted");
                // The online path up to the kernel's refusal: the device takes the
                // new length (kept, as the kernel could have begun to use it), the
                // ioctl reaches ext4 (EPERM, not ENOTTY), the filesystem is intact.
                match grow_online(&image, &a, 64 << 20) {
                    Err(GrowError::Failed { error, size }) => {
                        assert_eq!(error.kind(), io::ErrorKind::PermissionDenied, "{error}");
                        assert_eq!(size, Some(MIN_SIZE));
                    }
                    other => panic!("{other:?}"),
                }
                assert_eq!(len(&image), 64 << 20);
                let device = LoopDevice::find(&File::open(&image).unwrap())
                    .unwrap()
                    .unwrap();
                let sectors = std::fs::read_to_string(
                    Path::new("/sys/class/block")
                        .join(device.file_name().unwrap())
                        .join("size"),
                )
                .unwrap();
                assert_eq!(sectors.trim(), ((64u64 << 20) / 512).to_string());
                assert_eq!(total(&b), small);
                assert!(std::fs::read(b.join("kept")).unwrap() == kept);
            }
            Err(e) => panic!("{e}"),
        }
        unmount(&b).unwrap();

        // Mounted only here: grown (online or offline) and mounted as before.
        grow(&image, &a, 128 << 20).unwrap();
        assert!(is_mount_root(&a).unwrap());
        assert_eq!(len(&image), 128 << 20);
        assert!(total(&a) > 100 << 20, "{}", total(&a));
        fill(&a.join("big"), 96).unwrap();
        std::fs::remove_file(a.join("big")).unwrap();
        assert!(std::fs::read(a.join("kept")).unwrap() == kept);

        // Not mounted: offline, the way a host without CAP_SYS_RESOURCE grows it.
        unmount(&a).unwrap();
        assert!(released(&image).unwrap());
        grow_offline(&image, 256 << 20).unwrap();
        assert_eq!(
            geometry(&image).unwrap(),
            ((256 << 20) / BLOCK_SIZE, BLOCK_SIZE)
        );
        // A smaller or equal size changes nothing.
        grow_offline(&image, 200 << 20).unwrap();
        assert_eq!(len(&image), 256 << 20);
        mount(&image, &a).unwrap();
        assert!(total(&a) > 200 << 20, "{}", total(&a));
        assert!(std::fs::read(a.join("kept")).unwrap() == kept);
        unmount(&a).unwrap();

        // A growth resize2fs refuses (1 KiB blocks, as mkfs makes small filesystems
        // by default, cannot describe 1 TiB) is too large, with resize2fs's reason
        // (no path in it), and leaves the disk as it was; a size it can describe
        // still works.
        let old = dir.path().join("old");
        File::create(&old).unwrap().set_len(MIN_SIZE).unwrap();
        run_e2fs("mkfs.ext4", &["-q", "-F", "-b", "1024"], &old, None, |c| {
            c == 0
        })
        .unwrap();
        match grow_offline(&old, 1 << 40) {
            Err(GrowError::TooLarge { reason }) => {
                assert!(reason.contains("block group descriptors"), "{reason}");
                assert!(!reason.contains('/'), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(len(&old), MIN_SIZE);
        assert_eq!(geometry(&old).unwrap(), (MIN_SIZE / 1024, 1024));
        run_e2fs("e2fsck", &["-f", "-n"], &old, None, |c| c == 0).unwrap();
        grow_offline(&old, 4 << 30).unwrap();
        assert_eq!(geometry(&old).unwrap(), (4 << 20, 1024));
        let zeroes = dir.path().join("zeroes");
        std::fs::write(&zeroes, [0u8; 4096]).unwrap();
        let err = geometry(&zeroes).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
    }
}
