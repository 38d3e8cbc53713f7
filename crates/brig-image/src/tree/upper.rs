//! Turning the upper directory of an overlayfs mount into a layer.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::{is_overlay_xattr, scan, OPAQUE_XATTR};
use crate::{ImageError, Result};

/// Prepares the upper directory `root` of a brig overlay mount (`userxattr`,
/// so no redirects, metacopy or index) to be stored as a layer.
///
/// Removes the xattrs overlayfs keeps for its own bookkeeping (`origin`,
/// `impure`, `nlink`, `upper`, `uuid`, `protattr`, ...), which describe the
/// lower layers and the mount rather than the files, in both the `user.` and the
/// `trusted.` namespace, and keeps `user.overlay.opaque` = `y`.
///
/// Fails with [`ImageError::Unsupported`] on a redirect or metacopy xattr, which
/// would make the layer depend on the layers below it, and on xattr whiteouts
/// (`whiteout`, `whiteouts`, opaque = `x`), a whiteout format brig layers do not
/// use. On such an error the tree may already be partly cleaned; it is unusable
/// as a layer either way.
///
/// Symlinks are never followed. The mount must be gone: overlayfs must not
/// write to the upper directory meanwhile.
pub fn clean_upper(root: &Path) -> Result<()> {
    scan::walk(root, |_, full, _| {
        for name in scan::xattr_names(full)? {
            if !is_overlay_xattr(&name) {
                continue;
            }
            match name.as_bytes().strip_prefix(b"user.overlay.") {
                Some(b"redirect" | b"metacopy" | b"whiteout" | b"whiteouts") => {
                    return Err(ImageError::Unsupported(format!(
                        "{} has the overlay xattr {}: brig layers support neither \
                         redirects, metacopy nor xattr whiteouts (the upper directory must \
                         come from a userxattr mount without redirect_dir or metacopy)",
                        full.display(),
                        name.to_string_lossy()
                    )));
                }
                Some(b"opaque") => check_opaque(full)?,
                // Bookkeeping about the lower layers and the mount; and
                // trusted.overlay.*, which a userxattr mount neither reads nor
                // writes.
                _ => scan::remove_xattr(full, &name)?,
            }
        }
        Ok(true)
    })
}

fn check_opaque(dir: &Path) -> Result<()> {
    match scan::xattr_value(dir, OsStr::new(OPAQUE_XATTR))? {
        // "x" marks a directory that holds xattr whiteouts, not an opaque one.
        Some(value) if value != b"y" => Err(ImageError::Unsupported(format!(
            "{} has {OPAQUE_XATTR} = {:?}; only \"y\" (opaque) is supported",
            dir.display(),
            String::from_utf8_lossy(&value)
        ))),
        _ => Ok(()),
    }
}
