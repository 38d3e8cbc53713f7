//! Image layers as each sandbox sees them: detached clones of the host's shared,
//! read-only layer mounts, idmapped so the image's files have sensible owners.
//!
//! An image's files are owned by on-disk ids (mostly 0). A sandbox maps one host id
//! to its user, so without help every image file would show as `nobody` and the
//! sandbox could not change anything in its own root. Each layer is therefore
//! attached through an idmapped mount whose user namespace maps on-disk 0 to the
//! sandbox's host id: the image's root-owned files belong to the sandbox user, and
//! copy-ups into its private upper layer work. Other on-disk owners stay unmapped
//! (`nobody`). The build mapping needs no idmap: there on-disk ids are host ids.

use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;

use brig_policy::IdMapping;
use nix::sys::signal::Signal;
use nix::unistd::Pid;

use crate::sys::{self, CloneResult};
use crate::{Context, JailError};

const LAYER_ATTRS: u64 = sys::MOUNT_ATTR_RDONLY | sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV;

/// The user namespace idmapped mounts of a sandbox go through, if any of its mounts
/// needs one: image layers under the single mapping, and binds marked `idmapped`.
pub(crate) fn squash_for(
    layers: &[PathBuf],
    binds_idmapped: bool,
    mapping: IdMapping,
    host_uid: u32,
    host_gid: u32,
) -> Result<Option<OwnedFd>, JailError> {
    let needed = binds_idmapped || (!layers.is_empty() && mapping == IdMapping::Single);
    if needed {
        squash_userns(host_uid, host_gid).map(Some)
    } else {
        Ok(None)
    }
}

/// Detached, read-only clones of the layer mounts at `layers`, in the same order,
/// idmapped through `squash` when given.
pub(crate) fn layer_mounts(
    layers: &[PathBuf],
    squash: Option<&OwnedFd>,
) -> Result<Vec<OwnedFd>, JailError> {
    layers
        .iter()
        .map(|layer| {
            let tree = sys::open_tree_clone(layer)
                .context(|| format!("clone layer mount {}", layer.display()))?;
            match squash {
                Some(userns) => sys::mount_setattr_idmap(tree.as_fd(), userns.as_fd(), LAYER_ATTRS)
                    .context(|| format!("idmap layer {}", layer.display()))?,
                None => sys::mount_setattr_fd(tree.as_fd(), LAYER_ATTRS)
                    .context(|| format!("set flags on layer {}", layer.display()))?,
            }
            Ok(tree)
        })
        .collect()
}

/// A user namespace mapping only 0 to (`host_uid`, `host_gid`). A namespace needs a
/// process to be created in; a short-lived child makes it, and the descriptor keeps
/// the namespace alive after the child is gone.
fn squash_userns(host_uid: u32, host_gid: u32) -> Result<OwnedFd, JailError> {
    // SAFETY: brig starts sandboxes from a single-threaded process (run() checks);
    // the child only waits to be killed, calling nothing but pause().
    let child = match unsafe { sys::clone_process(libc::CLONE_NEWUSER) }
        .context(|| "create the idmap user namespace".into())?
    {
        CloneResult::Child => loop {
            // SAFETY: pause has no preconditions.
            unsafe { libc::pause() };
        },
        CloneResult::Parent { child } => Pid::from_raw(child),
    };
    let result = (|| {
        let dir = format!("/proc/{child}");
        std::fs::write(format!("{dir}/uid_map"), format!("0 {host_uid} 1\n"))
            .context(|| "write idmap uid_map".into())?;
        std::fs::write(format!("{dir}/setgroups"), "deny")
            .context(|| "deny setgroups in the idmap namespace".into())?;
        std::fs::write(format!("{dir}/gid_map"), format!("0 {host_gid} 1\n"))
            .context(|| "write idmap gid_map".into())?;
        std::fs::File::open(format!("{dir}/ns/user"))
            .map(OwnedFd::from)
            .context(|| "open the idmap user namespace".into())
    })();
    let _ = nix::sys::signal::kill(child, Signal::SIGKILL);
    let _ = nix::sys::wait::waitpid(child, None);
    result
}
