//! The store's verbs: import, snapshot, diff. Each leaves the store as it was when
//! it fails or is interrupted (its work directory goes with it; a layer committed
//! before the failure is unreferenced and left to gc).

use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use crate::error::{ImageError, IoContext, Result};
use crate::pack::PackOptions;
use crate::progress::Progress;
use crate::store::{now_unix, validate_name, ImageKind, ImageRecord, Store};
use crate::unpack::beneath;
use crate::{tree, unpack, ImageConfig};
use rustix::fs::{AtFlags, FileType};

/// Imports `source` (a directory, a tar archive, an OCI layout or a docker save
/// archive) as image `name`.
pub fn import(
    store: &Store,
    name: &str,
    source: &Path,
    replace: bool,
    progress: &dyn Progress,
) -> Result<ImageRecord> {
    validate_name(name)?;
    if !replace && store.has_image(name) {
        return Err(ImageError::ImageExists(name.to_string()));
    }
    let work = store.work_dir("import")?;
    let staging = work.path().join("staging");
    std::fs::create_dir(&staging).context(|| format!("create {}", staging.display()))?;
    let unpacked = unpack::unpack(source, &staging, progress)?;
    let count = unpacked.layers.len();
    // docker save keeps a layer per ENV or WORKDIR line; empty ones add nothing.
    let kept: Vec<_> = unpacked
        .layers
        .iter()
        .enumerate()
        .filter(|(_, layer)| count == 1 || !is_empty_dir(&layer.path))
        .collect();
    // Before any layer is packed, which takes longest.
    crate::store::check_layer_count(kept.len())?;
    let _lock = store.shared()?;
    let mut layers: Vec<String> = Vec::new();
    for (index, layer) in kept {
        if progress.cancelled() {
            return Err(ImageError::Interrupted);
        }
        progress.phase(&format!("layer {}/{count}", index + 1), None);
        let record =
            store.commit_layer(&layer.path, &PackOptions::default(), work.path(), progress)?;
        if !layer.borrowed {
            // Frees the disk the unpacked tree took before the next layer unpacks.
            let _ = crate::store::remove_tree(&layer.path);
        }
        layers.push(record.digest);
    }
    let record = ImageRecord {
        name: name.to_string(),
        layers,
        config: unpacked.config,
        created_unix: now_unix(),
        origin: format!("import {}", source.display()),
        kind: Default::default(),
    };
    store.commit_image(&record, replace, work.path())?;
    Ok(record)
}

/// What to snapshot: a sandbox's writes on top of the image it ran from.
pub struct Snapshot<'a> {
    pub base: &'a ImageRecord,
    /// The new image's name.
    pub name: &'a str,
    /// The sandbox's overlay upper directory, as a detached mount (brig-jail hands
    /// it over when the spec asks to capture writes). Only read, by descriptors.
    pub writes: BorrowedFd<'a>,
    /// Paths brig itself created or mounted over (see brig-jail's placeholders):
    /// left out when they are empty and the image did not have them.
    pub placeholders: &'a [String],
    /// Store every file as owned by this uid:gid: with one mapped id, everything the
    /// sandbox wrote belongs to that id, which stood for the image's root.
    pub force_owner: Option<(u32, u32)>,
    pub replace: bool,
    /// The most the regular files written may add up to, at their apparent sizes
    /// (what packing reads): the sandbox's disk limit, or a quota's room.
    pub max_bytes: Option<u64>,
    /// Where packing is charged (see [`PackOptions::charge_to`]).
    pub charge_to: &'a [PathBuf],
}

/// A sandbox's writes copied out of its reach (see [`tree::copy_beneath`]): what
/// [`commit_snapshot`] or [`commit_scratch`] turn into an image. Once staged, the
/// sandbox may run again: nothing it does reaches the copy. Dropped uncommitted,
/// the copy goes.
pub struct Staged {
    work: crate::store::WorkDir,
    tree: PathBuf,
}

/// Stores what a sandbox wrote as a new layer on top of its image, giving a new
/// image. A run that wrote nothing gives an image with the same layers.
pub fn snapshot(
    store: &Store,
    request: &Snapshot<'_>,
    progress: &dyn Progress,
) -> Result<ImageRecord> {
    let staged = stage_snapshot(store, request, progress)?;
    commit_snapshot(store, request, staged, progress)
}

/// The first half of [`snapshot`]: copies the sandbox's writes (the only part that
/// needs the sandbox kept still).
pub fn stage_snapshot(
    store: &Store,
    request: &Snapshot<'_>,
    progress: &dyn Progress,
) -> Result<Staged> {
    validate_name(request.name)?;
    request.base.check_root()?;
    if !request.replace && store.has_image(request.name) {
        return Err(ImageError::ImageExists(request.name.to_string()));
    }
    let work = store.work_dir("snapshot")?;
    let tree = work.path().join("upper");
    progress.phase("copy", None);
    let options = tree::CopyOptions {
        force_owner: request.force_owner,
        exclude: Vec::new(),
        max_bytes: request.max_bytes,
        shown_as: String::new(),
    };
    tree::copy_beneath(request.writes, &tree, &options, progress)?;
    Ok(Staged { work, tree })
}

/// The second half of [`snapshot`]: packs the staged copy into the new image.
pub fn commit_snapshot(
    store: &Store,
    request: &Snapshot<'_>,
    staged: Staged,
    progress: &dyn Progress,
) -> Result<ImageRecord> {
    let Snapshot {
        base,
        name,
        placeholders,
        force_owner,
        replace,
        charge_to,
        ..
    } = *request;
    let writes = staged.tree.as_path();
    tree::clean_upper(writes)?;
    let base_layers = store.use_layers(base)?;
    prune_placeholders(writes, placeholders, &base_layers.mounts)?;
    drop(base_layers);
    let _lock = store.shared()?;
    let mut layers = base.layers.clone();
    if !is_empty_dir(writes) {
        let options = PackOptions {
            force_owner,
            exclude: Vec::new(),
            charge_to: charge_to.to_vec(),
        };
        let record = store.commit_layer(writes, &options, staged.work.path(), progress)?;
        layers.push(record.digest);
    }
    let record = ImageRecord {
        name: name.to_string(),
        layers,
        config: base.config.clone(),
        created_unix: now_unix(),
        origin: format!("snapshot of {}", base.name),
        kind: Default::default(),
    };
    store.commit_image(&record, replace, staged.work.path())?;
    Ok(record)
}

/// What to snapshot of a sandbox on the host's system dirs: its private writable
/// directories, each a detached mount (a session's agent hands them out).
pub struct ScratchSnapshot<'a> {
    /// The new image's name.
    pub name: &'a str,
    /// Each directory by the name it gets in the layer's tree (`tmp`, `workspace`).
    pub dirs: &'a [(&'a str, BorrowedFd<'a>)],
    /// Paths relative to the tree left out (brig's own files, mount points).
    pub exclude: &'a [PathBuf],
    /// Store every file as owned by this uid:gid (see [`Snapshot::force_owner`]).
    pub force_owner: Option<(u32, u32)>,
    /// Says where it came from, in the image's `origin`.
    pub origin: &'a str,
    /// The most the regular files of all the directories may add up to (see
    /// [`Snapshot::max_bytes`]).
    pub max_bytes: Option<u64>,
    /// Where packing is charged (see [`PackOptions::charge_to`]).
    pub charge_to: &'a [PathBuf],
}

/// Stores a sandbox's private directories as one layer whose tree holds each by
/// name, giving an image of kind [`ImageKind::Scratch`]: not a root, but what fills
/// a new sandbox's directories of the same names (`Filesystem::seed`). The layer
/// holds their whole content (no base, no whiteouts), so deletions need nothing.
pub fn snapshot_scratch(
    store: &Store,
    request: &ScratchSnapshot<'_>,
    progress: &dyn Progress,
) -> Result<ImageRecord> {
    let staged = stage_scratch(store, request, progress)?;
    commit_scratch(store, request, staged, progress)
}

/// The first half of [`snapshot_scratch`]: copies the directories.
pub fn stage_scratch(
    store: &Store,
    request: &ScratchSnapshot<'_>,
    progress: &dyn Progress,
) -> Result<Staged> {
    validate_name(request.name)?;
    if store.has_image(request.name) {
        return Err(ImageError::ImageExists(request.name.to_string()));
    }
    let work = store.work_dir("snapshot")?;
    let tree = work.path().join("tree");
    std::fs::DirBuilder::new()
        .mode(0o755)
        .create(&tree)
        .context(|| format!("create {}", tree.display()))?;
    progress.phase("copy", None);
    let mut left = request.max_bytes;
    for (name, fd) in request.dirs {
        if name.is_empty() || name.contains('/') || name.starts_with('.') {
            return Err(ImageError::BadName(format!("{name:?}")));
        }
        let options = tree::CopyOptions {
            force_owner: request.force_owner,
            exclude: request
                .exclude
                .iter()
                .filter_map(|path| path.strip_prefix(name).ok())
                .filter(|rest| !rest.as_os_str().is_empty())
                .map(Path::to_path_buf)
                .collect(),
            max_bytes: left,
            shown_as: format!("/{name}"),
        };
        let copied = tree::copy_beneath(*fd, &tree.join(name), &options, progress)?;
        left = left.map(|max| max.saturating_sub(copied.bytes));
    }
    Ok(Staged { work, tree })
}

/// The second half of [`snapshot_scratch`]: packs the staged copy.
pub fn commit_scratch(
    store: &Store,
    request: &ScratchSnapshot<'_>,
    staged: Staged,
    progress: &dyn Progress,
) -> Result<ImageRecord> {
    let _lock = store.shared()?;
    let options = PackOptions {
        force_owner: request.force_owner,
        exclude: Vec::new(),
        charge_to: request.charge_to.to_vec(),
    };
    let layer = store.commit_layer(&staged.tree, &options, staged.work.path(), progress)?;
    let record = ImageRecord {
        name: request.name.to_string(),
        layers: vec![layer.digest],
        config: ImageConfig::default(),
        created_unix: now_unix(),
        origin: request.origin.to_string(),
        kind: ImageKind::Scratch,
    };
    store.commit_image(&record, false, staged.work.path())?;
    Ok(record)
}

/// What changed from image `a` to image `b`.
pub fn diff(store: &Store, a: &str, b: &str) -> Result<tree::Diff> {
    let a = store.image(a)?;
    let b = store.image(b)?;
    let a_layers = store.use_layers(&a)?;
    let b_layers = store.use_layers(&b)?;
    let a_paths: Vec<&Path> = a_layers.mounts.iter().map(|p| p.as_path()).collect();
    let b_paths: Vec<&Path> = b_layers.mounts.iter().map(|p| p.as_path()).collect();
    tree::diff(&a_paths, &b_paths)
}

/// A new image config from a base one: recipe or caller values win.
pub fn merge_config(base: &ImageConfig, over: &ImageConfig) -> ImageConfig {
    let mut env = base.env.clone();
    for entry in &over.env {
        let key = entry.split('=').next().unwrap_or_default();
        env.retain(|e| e.split('=').next() != Some(key));
        env.push(entry.clone());
    }
    ImageConfig {
        env,
        user: over.user.clone().or_else(|| base.user.clone()),
        workdir: over.workdir.clone().or_else(|| base.workdir.clone()),
        entrypoint: if over.entrypoint.is_empty() {
            base.entrypoint.clone()
        } else {
            over.entrypoint.clone()
        },
        cmd: if over.cmd.is_empty() {
            base.cmd.clone()
        } else {
            over.cmd.clone()
        },
    }
}

/// Removes the mount points brig created in the upper layer because the image
/// lacked them (an empty file or directory the image does not have), and then the
/// directories they alone made the upper layer copy (empty, not opaque, and in the
/// image): they are brig's, not the sandbox's writes.
///
/// The upper layer is the sandbox's and the base layers are the image's, and this
/// runs as host root: every path is resolved beneath its tree's fd and no symlink is
/// followed, so a symlink planted where a placeholder's parent should be cannot
/// point these removals (or the lookups deciding them) at host files.
fn prune_placeholders(upper: &Path, placeholders: &[String], base: &[PathBuf]) -> Result<()> {
    use std::os::fd::AsFd;
    use std::os::unix::ffi::OsStrExt;
    let upper_fd = beneath::open_root(upper).context(|| format!("open {}", upper.display()))?;
    let base_fds = base
        .iter()
        .map(|layer| beneath::open_root(layer).context(|| format!("open {}", layer.display())))
        .collect::<Result<Vec<_>>>()?;
    // The parent's fd and the last component of `rel`, if its parent is a real
    // directory beneath `root`.
    let split = |root: BorrowedFd<'_>, rel: &Path| -> Option<(OwnedFd, Vec<u8>)> {
        let name = rel.file_name()?.as_bytes().to_vec();
        let parent = rel.parent().map_or(&b""[..], |p| p.as_os_str().as_bytes());
        Some((beneath::open_dir(root, parent).ok()?, name))
    };
    let in_base = |rel: &Path| {
        base_fds.iter().any(|layer| {
            split(layer.as_fd(), rel).is_some_and(|(parent, name)| {
                matches!(beneath::file_type(parent.as_fd(), &name), Ok(Some(_)))
            })
        })
    };
    let mut parents = std::collections::BTreeSet::new();
    for path in placeholders {
        let rel = Path::new(path.trim_start_matches('/'));
        let Some((parent, name)) = split(upper_fd.as_fd(), rel) else {
            continue;
        };
        let Ok(stat) = rustix::fs::statat(&parent, name.as_slice(), AtFlags::SYMLINK_NOFOLLOW)
        else {
            continue;
        };
        let kind = FileType::from_raw_mode(stat.st_mode);
        let placeholder = match kind {
            FileType::RegularFile => stat.st_size == 0,
            FileType::Directory => beneath::is_empty_dir(parent.as_fd(), &name),
            _ => false,
        };
        if placeholder && !in_base(rel) {
            let flags = if kind == FileType::Directory {
                AtFlags::REMOVEDIR
            } else {
                AtFlags::empty()
            };
            rustix::fs::unlinkat(&parent, name.as_slice(), flags)
                .context(|| format!("remove placeholder {path}"))?;
            let mut ancestor = rel.parent();
            while let Some(dir) = ancestor.filter(|p| !p.as_os_str().is_empty()) {
                parents.insert(dir.to_path_buf());
                ancestor = dir.parent();
            }
        }
    }
    // Deepest first, so a parent is looked at after its children.
    for dir in parents.iter().rev() {
        let Some((parent, name)) = split(upper_fd.as_fd(), dir) else {
            continue;
        };
        let Ok(fd) = beneath::open_dir(parent.as_fd(), &name) else {
            continue;
        };
        let opaque = rustix::fs::fgetxattr(&fd, tree::OPAQUE_XATTR, &mut [0u8; 4]).is_ok();
        if !opaque && beneath::is_empty_dir(parent.as_fd(), &name) && in_base(dir) {
            rustix::fs::unlinkat(&parent, name.as_slice(), AtFlags::REMOVEDIR)
                .context(|| format!("remove {}", dir.display()))?;
        }
    }
    Ok(())
}

fn is_empty_dir(path: &Path) -> bool {
    std::fs::read_dir(path).is_ok_and(|mut entries| entries.next().is_none())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn placeholders_are_pruned_only_beneath_the_upper_layer() {
        let tmp = tempfile::tempdir().unwrap();
        let (upper, base, host) = (
            tmp.path().join("upper"),
            tmp.path().join("base"),
            tmp.path().join("host"),
        );
        for dir in [&upper, &base, &host] {
            std::fs::create_dir(dir).unwrap();
        }
        std::fs::create_dir_all(base.join("run/brig")).unwrap();
        // brig's placeholder, where the image lacked it: removed, and so are the
        // directories it alone made the upper layer copy.
        std::fs::create_dir_all(upper.join("run/brig")).unwrap();
        std::fs::write(upper.join("run/brig/hosts"), "").unwrap();
        // What the sandbox wrote over one is its own.
        std::fs::create_dir(upper.join("data")).unwrap();
        std::fs::write(upper.join("data/kept"), "written").unwrap();
        // A sandbox that made /etc a link to a host directory holding empty files
        // and directories of the placeholders' names.
        for file in ["hosts", "hostname", "resolv.conf"] {
            std::fs::write(host.join(file), "").unwrap();
        }
        std::fs::create_dir(host.join("pts")).unwrap();
        symlink(&host, upper.join("etc")).unwrap();
        let placeholders: Vec<String> = [
            "/etc/hosts",
            "/etc/hostname",
            "/etc/resolv.conf",
            "/etc/pts",
            "/run/brig/hosts",
            "/data/kept",
        ]
        .map(String::from)
        .to_vec();
        prune_placeholders(&upper, &placeholders, &[base]).unwrap();
        let mut left: Vec<_> = std::fs::read_dir(&host)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, ["hostname", "hosts", "pts", "resolv.conf"]);
        assert!(upper.join("etc").symlink_metadata().unwrap().is_symlink());
        assert!(
            !upper.join("run").exists(),
            "brig's own directories are gone"
        );
        assert_eq!(std::fs::read(upper.join("data/kept")).unwrap(), b"written");
    }
}
