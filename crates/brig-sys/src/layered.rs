//! Reading a small file as stacked image layers show it, from the host.

use std::path::PathBuf;

/// A file as the stacked layers show it (top layer wins; a whiteout or a non-file
/// there hides lower ones). Only used for small text databases like /etc/passwd
/// (at most [`MAX_LAYERED_READ`] bytes). `layers` are bottom first.
///
/// The layers are an image's and brig reads them as host root: `path` is resolved
/// beneath each layer without following any symlink, so one planted in an image
/// (`etc -> ../../../../etc`) cannot lead brig to a host file. A symlink in the way
/// hides what is below it, as a non-file does (the sandbox's own view, through it,
/// is not the database brig would read).
pub fn read_layered(layers: &[PathBuf], path: &str) -> Option<String> {
    use rustix::fs::{Mode, OFlags, ResolveFlags};
    use std::io::Read;
    let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
    // Not blocking on a FIFO, and no controlling terminal from a device.
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY;
    for layer in layers.iter().rev() {
        let dir_flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let Ok(root) = rustix::fs::open(layer, dir_flags, Mode::empty()) else {
            continue;
        };
        let file = match crate::resolve::openat2(&root, path, flags, Mode::empty(), resolve) {
            Ok(fd) => std::fs::File::from(fd),
            Err(rustix::io::Errno::NOENT) => continue,
            Err(_) => return None,
        };
        if !file.metadata().is_ok_and(|meta| meta.is_file()) {
            return None;
        }
        let mut text = String::new();
        let read = file.take(MAX_LAYERED_READ + 1).read_to_string(&mut text);
        return read
            .ok()
            .filter(|&n| n as u64 <= MAX_LAYERED_READ)
            .map(|_| text);
    }
    None
}

/// The largest database [`read_layered`] reads (a passwd of ~100,000 users).
pub const MAX_LAYERED_READ: u64 = 16 << 20;
