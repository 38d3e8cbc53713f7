//! Mounting a layer file once per host.
//!
//! Kernels since 6.12 mount an EROFS image file directly (file-backed mounts), so no
//! loop device is involved. Older kernels answer ENOTBLK; brig then attaches a
//! read-only loop device with autoclear, which the kernel releases by itself when
//! the layer is unmounted. `BRIG_LAYER_MOUNT=loop` forces the loop path (tests use
//! it to cover both on a new kernel).

use std::os::fd::BorrowedFd;
use std::path::Path;

use rustix::mount::{MountFlags, UnmountFlags};

use crate::error::{ImageError, IoContext, Result};

/// Read-only, and neither setuid bits nor device nodes of an image count on the
/// host: an imported image is untrusted, and its layers stay mounted in the store
/// (a 0700 directory is then not all that stands between them and the host).
const LAYER_MOUNT_FLAGS: MountFlags = MountFlags::RDONLY
    .union(MountFlags::NOSUID)
    .union(MountFlags::NODEV);

pub fn mount_layer(file: BorrowedFd<'_>, path: &Path, mount_point: &Path) -> Result<()> {
    let force_loop = std::env::var("BRIG_LAYER_MOUNT").is_ok_and(|v| v == "loop");
    if !force_loop {
        match rustix::mount::mount(path, mount_point, "erofs", LAYER_MOUNT_FLAGS, None) {
            Ok(()) => return Ok(()),
            Err(rustix::io::Errno::NOTBLK) => {}
            Err(e) => {
                return Err(ImageError::io(
                    format!("mount layer {}", path.display()),
                    e.into(),
                ))
            }
        }
    }
    let device = brig_sys::loopdev::LoopDevice::attach_read_only(file)
        .context(|| format!("attach {} to a loop device", path.display()))?;
    let mounted = rustix::mount::mount(&device.path, mount_point, "erofs", LAYER_MOUNT_FLAGS, None);
    if let Err(e) = mounted {
        let device_path = device.path.clone();
        // Not mounted, so autoclear will never fire: detach now.
        let _ = device.detach();
        return Err(ImageError::io(
            format!(
                "mount layer {} from {}",
                path.display(),
                device_path.display()
            ),
            e.into(),
        ));
    }
    // Dropping our descriptor is fine: the mount holds the device, and autoclear
    // releases it at unmount.
    Ok(())
}

/// Unmounts a layer. Only called when no sandbox holds it (see `Store::gc`); a
/// sandbox's own clone of the mount would keep the superblock alive anyway.
pub fn unmount_layer(mount_point: &Path) -> Result<()> {
    rustix::mount::unmount(mount_point, UnmountFlags::DETACH)
        .context(|| format!("unmount {}", mount_point.display()))
}
