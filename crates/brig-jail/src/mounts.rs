//! Executes an [`FsPlan`] inside the sandbox's new mount namespace and pivots into it.
//!
//! Order (each step depends on the one before):
//! 1. make every mount private, so nothing propagates back to the host;
//! 2. get every host source as a detached mount with its flags set: cloned by the
//!    parent (see [`Sources`]), or here (`open_tree`) before anything is mounted
//!    over host paths that a source might live under;
//! 3. mount the new root (a small tmpfs) on the staging directory and the scratch
//!    tmpfs beside it;
//! 4. run the plan's steps, resolving every target with `RESOLVE_IN_ROOT` so a
//!    symlink inside a rootfs cannot redirect a mount outside the new root;
//! 5. `pivot_root(".", ".")` and detach the old root: the host tree is gone;
//! 6. make the new root read-only.

use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::OFlag;
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sys::stat::Mode;

use crate::fsplan::{Access, FsOp, FsPlan, NodeKind, ScratchDir};
use crate::sys;
use crate::{Context, JailError};

/// A sandbox's own devpts instance, with at most `max` terminals: every private
/// instance on the host draws on one shared pool (`kernel.pty.max` less
/// `kernel.pty.reserve`, 3072 by default), which one sandbox could otherwise empty.
const DEVPTS_OPTIONS: &str = "newinstance,ptmxmode=0666,mode=0620,max=64";
/// Where the root is assembled and where the scratch tmpfs sits meanwhile: scratch
/// (which holds /tmp, /workspace, /dev/shm and an image's upper layer) is mounted
/// over /tmp of the namespace's copy of the host tree (harmless in our private
/// namespace: every host source was cloned before) and the root inside it. Scratch
/// thus leaves with the old root at the pivot, in the same detach, while the binds
/// of its directories (and an overlay) keep what they use of it alive.
struct Staging {
    root: &'static str,
    scratch: &'static str,
}

const STAGING: Staging = Staging {
    root: "/tmp/root",
    scratch: "/tmp",
};

impl Staging {
    fn staged(&self, path: &str) -> PathBuf {
        PathBuf::from(format!("{}{path}", self.root))
    }

    fn scratch(&self, name: &str) -> PathBuf {
        PathBuf::from(format!("{}/{name}", self.scratch))
    }
}

fn attrs(access: Access) -> u64 {
    match access {
        Access::ReadOnly => sys::MOUNT_ATTR_RDONLY | sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV,
        Access::ReadWrite => sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV,
        Access::Device => sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NOEXEC,
    }
}

/// Where the sources of a plan's binds and copies come from.
pub enum Sources<'a> {
    /// Opened here, as the sandbox user, before the root is built: rootless brig,
    /// whose unprivileged parent may not clone mounts.
    Here,
    /// Opened by the parent (root): it can reach paths the sandbox user cannot (the
    /// daemon's private data dir), can idmap them, and does it while this process
    /// builds the rest of the root. The function receives them ([`open_sources`]).
    FromParent(&'a mut dyn FnMut() -> Result<Vec<OwnedFd>, JailError>),
}

/// The sources of `plan`'s binds (detached clones with their flags set; those marked
/// `idmapped` through `squash`, see `idmap::squash_for`) followed by its copies (read
/// descriptors), each in plan order. Sources below the plan's untrusted root are
/// opened as `as_user` (the sandbox's host uid and gid) when given, so a symlink
/// raced in there reaches nothing that user could not read anyway.
pub fn open_sources(
    plan: &FsPlan,
    squash: Option<&OwnedFd>,
    as_user: Option<(u32, u32)>,
) -> Result<Vec<OwnedFd>, JailError> {
    let guarded = |source: &Path| -> Result<Option<crate::session::ActingAs>, JailError> {
        match (as_user, &plan.untrusted_root) {
            (Some((uid, gid)), Some(root)) if source.starts_with(root) => {
                crate::session::act_as(uid, gid)
                    .map(Some)
                    .context(|| "take the sandbox user's file access rights".into())
            }
            _ => Ok(None),
        }
    };
    let mut sources = Vec::new();
    for op in &plan.ops {
        if let FsOp::Bind {
            source,
            access,
            idmapped,
            no_symlinks,
            ..
        } = op
        {
            let acting = guarded(source)?;
            let tree = if *no_symlinks {
                open_tree_no_symlinks(source)?
            } else {
                sys::open_tree_clone(source)
                    .context(|| format!("bind source {}", source.display()))?
            };
            drop(acting);
            match squash.filter(|_| *idmapped) {
                Some(userns) => {
                    // The idmap applies to the top mount only (a mount inside the
                    // source may not support one): its flags go on every mount of
                    // the clone first, as for a plain bind.
                    sys::mount_setattr_fd(tree.as_fd(), attrs(*access))
                        .context(|| format!("set flags on {}", source.display()))?;
                    sys::mount_setattr_idmap(tree.as_fd(), userns.as_fd(), attrs(*access))
                        .context(|| format!("idmap {}", source.display()))?
                }
                None if *idmapped => {
                    return Err(JailError::Unsupported(format!(
                        "{} needs an idmapped mount, which needs brig to run as root",
                        source.display()
                    )))
                }
                None => sys::mount_setattr_fd(tree.as_fd(), attrs(*access))
                    .context(|| format!("set flags on {}", source.display()))?,
            }
            sources.push(tree);
        }
    }
    for op in &plan.ops {
        if let FsOp::Copy { source, .. } = op {
            let acting = guarded(source)?;
            // The plan saw a regular file: a symlink there now is refused.
            let file = nix::fcntl::open(
                source.as_path(),
                OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
            .context(|| format!("open {}", source.display()))?;
            drop(acting);
            sources.push(unsafe_owned(file));
        }
    }
    Ok(sources)
}

/// A clone of the tree at `source`, reached through no symlink: open_tree itself
/// follows them, so the path is opened first and the clone taken from that
/// descriptor.
fn open_tree_no_symlinks(source: &Path) -> Result<OwnedFd, JailError> {
    use rustix::fs::{Mode, OFlags, ResolveFlags};
    let opened = crate::resolve::openat2(
        rustix::fs::CWD,
        source,
        OFlags::PATH | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )
    .map_err(|e| match e {
        rustix::io::Errno::LOOP => JailError::HostPath {
            path: source.display().to_string(),
            reason: "it now leads through a symlink, so it changed after it was checked".into(),
        },
        e => JailError::HostPath {
            path: source.display().to_string(),
            reason: std::io::Error::from(e).to_string(),
        },
    })?;
    sys::open_tree_clone_fd(opened.as_fd()).context(|| format!("bind source {}", source.display()))
}

/// What a sandbox writes, kept reachable for snapshots (see
/// `Filesystem::capture_writes`): detached mounts, because once this namespace is
/// gone only a mount tree can be attached by the parent or the daemon at a path
/// that tools like mkfs.erofs can read.
pub enum Writes {
    None,
    /// An image root's overlay upper directory.
    Upper(OwnedFd),
    /// On the host's system dirs: the scratch directories the sandbox writes
    /// (`tmp`, `workspace`), by name. Each clone holds just its directory: the
    /// mounts later made below /tmp or /workspace (bundles) are not in it.
    Scratch(Vec<(ScratchDir, OwnedFd)>),
}

/// Builds the root and pivots into it. On return the process's root and cwd are the
/// sandbox's `/`. `layers` are the image's layer mounts (bottom first), detached and
/// prepared by the parent; with them the root is an overlay. With `capture_writes`
/// what the sandbox will write is returned: the overlay's upper layer, or on the
/// host's system dirs the scratch directories the plan mounts at /tmp and
/// /workspace.
pub fn build_root(
    plan: &FsPlan,
    layers: Vec<OwnedFd>,
    sources: Sources<'_>,
    capture_writes: bool,
) -> Result<Writes, JailError> {
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .context(|| "make mounts private".into())?;

    // Rootless: opened now, before anything is mounted over host paths.
    let opened_here = match sources {
        Sources::Here => Some(open_sources(plan, None, None)?),
        Sources::FromParent(_) => None,
    };

    let layered = !plan.layers.is_empty();
    let staging = STAGING;
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    let inodes = (plan.scratch_bytes / 4096).max(4096);
    mount(
        Some("brig-scratch"),
        staging.scratch,
        Some("tmpfs"),
        flags,
        Some(format!("mode=0755,size={},nr_inodes={inodes}", plan.scratch_bytes).as_str()),
    )
    .context(|| "mount scratch tmpfs (--disk)".into())?;
    for dir in ScratchDir::ALL {
        std::fs::DirBuilder::new()
            .mode(dir.mode())
            .create(staging.scratch(dir.name()))
            .context(|| format!("create scratch {}", dir.name()))?;
    }
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(staging.scratch("gen"))
        .context(|| "create scratch gen".into())?;

    if !layered {
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(staging.root)
            .context(|| "create root mount point".into())?;
        mount(
            Some("brig"),
            staging.root,
            Some("tmpfs"),
            flags,
            Some("mode=0755,size=16m,nr_inodes=16384"),
        )
        .context(|| "mount root tmpfs".into())?;
    }
    if layered {
        mount_overlay(&staging, layers)?;
    }
    // Cloned now, before anything is mounted below these directories.
    let writes = match (capture_writes, layered) {
        (false, _) => Writes::None,
        (true, true) => Writes::Upper(
            sys::open_tree_clone(&staging.scratch("upper"))
                .context(|| "clone the upper layer".into())?,
        ),
        (true, false) => {
            let mut dirs = Vec::new();
            for op in &plan.ops {
                if let FsOp::Scratch { dir, .. } = op {
                    if *dir != ScratchDir::Shm {
                        let tree = sys::open_tree_clone(&staging.scratch(dir.name()))
                            .context(|| format!("clone scratch {}", dir.name()))?;
                        dirs.push((*dir, tree));
                    }
                }
            }
            Writes::Scratch(dirs)
        }
    };

    let root = nix::fcntl::open(
        staging.root,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .context(|| "open new root".into())?;
    let mut tree = Tree {
        root: unsafe_owned(root),
        dirs: HashMap::new(),
        generated: 0,
        read_only: Vec::new(),
    };

    let mut sources = match (opened_here, sources) {
        (Some(opened), _) => opened,
        (None, Sources::FromParent(receive)) => receive()?,
        (None, Sources::Here) => unreachable!("opened above"),
    };
    let binds = plan.ops.iter().filter(|op| matches!(op, FsOp::Bind { .. }));
    let copies = plan.ops.iter().filter(|op| matches!(op, FsOp::Copy { .. }));
    let bind_count = binds.count();
    if sources.len() != bind_count + copies.count() {
        return Err(JailError::Setup(
            "the parent sent the wrong number of sources".into(),
        ));
    }
    let mut copies = sources.split_off(bind_count).into_iter();
    let mut sources = sources.into_iter();
    for op in &plan.ops {
        run_op(&staging, &mut tree, op, &mut sources, &mut copies)?;
    }

    drop(tree);

    nix::unistd::chdir(staging.root).context(|| "enter new root".into())?;
    sys::pivot_root(Path::new("."), Path::new(".")).context(|| "pivot_root".into())?;
    // The old root now sits on top of the new one at "."; detaching it removes every
    // host mount from this namespace, and scratch with them.
    umount2(".", MntFlags::MNT_DETACH).context(|| "detach old root".into())?;
    nix::unistd::chdir("/").context(|| "chdir /".into())?;
    let root_attrs = if layered {
        // An image's root stays writable: writes go to the sandbox's own upper layer.
        sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV
    } else {
        sys::MOUNT_ATTR_RDONLY | sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV
    };
    sys::mount_setattr_path(Path::new("/"), root_attrs)
        .context(|| "set flags on the root".into())?;
    Ok(writes)
}

/// Mounts the overlay root: the layers (attached under scratch, top first as
/// overlayfs wants them) below, `upper` and `work` on the scratch tmpfs. `userxattr`
/// because the mount is made inside the sandbox's user namespace, where trusted.*
/// xattrs are off limits; layers use `user.overlay.opaque` accordingly.
fn mount_overlay(staging: &Staging, layers: Vec<OwnedFd>) -> Result<(), JailError> {
    for name in ["upper", "work", "lower"] {
        std::fs::DirBuilder::new()
            .mode(0o755)
            .create(staging.scratch(name))
            .context(|| format!("create scratch {name}"))?;
    }
    let mut lower_paths = Vec::with_capacity(layers.len());
    for (index, layer) in layers.iter().enumerate() {
        let path = staging.scratch(&format!("lower/{index}"));
        std::fs::DirBuilder::new()
            .mode(0o755)
            .create(&path)
            .context(|| format!("create layer mount point {index}"))?;
        let target = nix::fcntl::open(
            &path,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .context(|| format!("open layer mount point {index}"))?;
        sys::move_mount_fd(layer.as_fd(), unsafe_owned(target).as_fd())
            .context(|| format!("attach layer {index}"))?;
        lower_paths.push(path);
    }
    // The merged root takes its owner, mode and times from the upper directory:
    // start it as the image's top root, so an untouched root is unchanged.
    if let Some(top) = lower_paths.last() {
        let meta = std::fs::metadata(top).context(|| "stat the image's root".into())?;
        let upper = staging.scratch("upper");
        std::fs::set_permissions(
            &upper,
            std::fs::Permissions::from_mode(meta.mode() & 0o7777),
        )
        .context(|| "set the upper root's mode".into())?;
        let mtime = nix::sys::time::TimeSpec::new(meta.mtime(), meta.mtime_nsec());
        nix::sys::stat::utimensat(
            None,
            &upper,
            &mtime,
            &mtime,
            nix::sys::stat::UtimensatFlags::NoFollowSymlink,
        )
        .context(|| "set the upper root's times".into())?;
    }
    use std::os::unix::ffi::OsStrExt;
    let context = sys::FsContext::open("overlay").context(|| "open overlayfs".into())?;
    let overlay = (|| {
        // One layer per key: the option string of mount(2) is limited to a page.
        // Kernels before 6.8 lack `lowerdir+`; they get the classic colon-separated
        // list, which the short mount-point names here keep under a page for
        // about 250 layers.
        let top_first: Vec<&[u8]> = lower_paths
            .iter()
            .rev()
            .map(|p| p.as_os_str().as_bytes())
            .collect();
        match context.set_string("lowerdir+", top_first[0]) {
            Ok(()) => {
                for path in &top_first[1..] {
                    context.set_string("lowerdir+", path)?;
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                context.set_string("lowerdir", &top_first.join(&b':'))?;
            }
            Err(e) => return Err(e),
        }
        context.set_string("upperdir", staging.scratch("upper").as_os_str().as_bytes())?;
        context.set_string("workdir", staging.scratch("work").as_os_str().as_bytes())?;
        context.set_flag("userxattr")?;
        context.mount(sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV)
    })()
    .map_err(|e| {
        if e.raw_os_error() == Some(libc::ELOOP) {
            JailError::Setup(
                "cannot stack the layers: one layer contains another (layers must not overlap)"
                    .into(),
            )
        } else {
            JailError::sys("mount the image's overlay root", e)
        }
    })?;
    std::fs::DirBuilder::new()
        .mode(0o755)
        .create(staging.root)
        .context(|| "create root mount point".into())?;
    let target = nix::fcntl::open(
        staging.root,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .context(|| "open root mount point".into())?;
    sys::move_mount_fd(overlay.as_fd(), unsafe_owned(target).as_fd())
        .context(|| "attach the overlay root".into())?;
    Ok(())
}

fn run_op(
    staging: &Staging,
    tree: &mut Tree,
    op: &FsOp,
    sources: &mut impl Iterator<Item = OwnedFd>,
    copies: &mut impl Iterator<Item = OwnedFd>,
) -> Result<(), JailError> {
    match op {
        FsOp::Dir { path, mode } => {
            tree.dir(path, *mode)?;
        }
        FsOp::Symlink { path, target } => {
            let (parent, name) = tree.parent_of(path)?;
            nix::unistd::symlinkat(target.as_path(), Some(parent), name)
                .context(|| format!("symlink {path}"))?;
        }
        FsOp::Copy {
            path, mode, size, ..
        } => {
            let source = copies.next().expect("one source per copy, in plan order");
            copy_file(tree, path, &source, *mode, *size)?;
        }
        FsOp::File {
            path,
            contents,
            mode,
        } => write_file(tree, path, contents, *mode)?,
        FsOp::Bind {
            path, kind, access, ..
        } => {
            let source = sources
                .next()
                .expect("one source per bind, cloned in plan order");
            let target = tree.mount_point(path, *kind)?;
            sys::move_mount_fd(source.as_fd(), target.as_fd())
                .context(|| format!("bind at {path}"))?;
            tree.mounted(path);
            if *kind == NodeKind::Dir && *access == Access::ReadOnly {
                tree.read_only.push(format!("{path}/"));
            }
        }
        FsOp::Scratch { dir, path } => {
            let source = sys::open_tree_clone(&staging.scratch(dir.name()))
                .context(|| format!("clone scratch {}", dir.name()))?;
            sys::mount_setattr_fd(source.as_fd(), attrs(Access::ReadWrite))
                .context(|| format!("set flags on scratch {}", dir.name()))?;
            let target = tree.mount_point(path, NodeKind::Dir)?;
            sys::move_mount_fd(source.as_fd(), target.as_fd())
                .context(|| format!("mount {path}"))?;
            tree.mounted(path);
        }
        FsOp::Tmpfs {
            path,
            size_bytes,
            mode,
        } => {
            mount(
                Some("tmpfs"),
                &staging.staged(path),
                Some("tmpfs"),
                MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
                Some(format!("mode={mode:o},size={size_bytes},nr_inodes=1024").as_str()),
            )
            .context(|| format!("mount tmpfs at {path}"))?;
            tree.mounted(path);
        }
        FsOp::Proc { path } => {
            mount(
                Some("proc"),
                &staging.staged(path),
                Some("proc"),
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
                None::<&str>,
            )
            .context(|| format!("mount proc at {path}"))?;
            tree.mounted(path);
        }
        FsOp::Devpts { path } => {
            mount(
                Some("devpts"),
                &staging.staged(path),
                Some("devpts"),
                MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
                Some(DEVPTS_OPTIONS),
            )
            .context(|| format!("mount devpts at {path}"))?;
            tree.mounted(path);
        }
        FsOp::Mask { path } => mask(staging, path)?,
        FsOp::ReadOnly { path } => {
            let target = staging.staged(path);
            // Not stat'ed first: a bind of a missing entry fails with ENOENT just as
            // cheaply, and then there is nothing to protect.
            match mount(
                Some(&target),
                &target,
                None::<&str>,
                MsFlags::MS_BIND | MsFlags::MS_REC,
                None::<&str>,
            ) {
                Err(nix::errno::Errno::ENOENT) => {}
                rebound => {
                    rebound.context(|| format!("rebind {path}"))?;
                    sys::mount_setattr_path(
                        &target,
                        sys::MOUNT_ATTR_RDONLY
                            | sys::MOUNT_ATTR_NOSUID
                            | sys::MOUNT_ATTR_NODEV
                            | sys::MOUNT_ATTR_NOEXEC,
                    )
                    .context(|| format!("make {path} read-only"))?;
                }
            }
        }
        FsOp::Generated { path, contents } => {
            tree.generated += 1;
            let file = staging.scratch(&format!("gen/{}", tree.generated));
            {
                use std::os::unix::fs::OpenOptionsExt;
                let mut out = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o644)
                    .open(&file)
                    .context(|| format!("write {path}"))?;
                out.write_all(contents)
                    .context(|| format!("write {path}"))?;
            }
            let source =
                sys::open_tree_clone(&file).context(|| format!("clone generated {path}"))?;
            sys::mount_setattr_fd(source.as_fd(), attrs(Access::ReadOnly))
                .context(|| format!("set flags on {path}"))?;
            if let Some(target) = tree.file_over(path)? {
                sys::move_mount_fd(source.as_fd(), target.as_fd())
                    .context(|| format!("bind at {path}"))?;
            }
        }
        FsOp::Seal { path } => {
            sys::mount_setattr_path(&staging.staged(path), sys::MOUNT_ATTR_RDONLY)
                .context(|| format!("make {path} read-only"))?;
        }
    }
    Ok(())
}

/// /proc entries that are directories on the kernels brig knows: a guess that only
/// orders the attempts in [`mask`] (a wrong one costs a failed mount, not safety).
const PROC_DIRS: &[&str] = &["/proc/acpi", "/proc/asound", "/proc/scsi"];

/// Hides a /proc entry: an empty read-only tmpfs over a directory, /dev/null over a
/// file. Not stat'ed first: the mount of the likely kind is tried, and the kernel's
/// answer says the rest (ENOENT: not on this kernel, nothing to hide; ENOTDIR: the
/// other kind).
fn mask(staging: &Staging, path: &str) -> Result<(), JailError> {
    let target = staging.staged(path);
    let over_dir = || {
        mount(
            Some("tmpfs"),
            &target,
            Some("tmpfs"),
            MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
            Some("size=4k,nr_inodes=1,mode=0555"),
        )
    };
    let over_file = || {
        mount(
            Some(&staging.staged("/dev/null")),
            &target,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
    };
    let (likely, other): (&dyn Fn() -> nix::Result<()>, &dyn Fn() -> nix::Result<()>) =
        if PROC_DIRS.contains(&path) {
            (&over_dir, &over_file)
        } else {
            (&over_file, &over_dir)
        };
    match likely() {
        Ok(()) | Err(nix::errno::Errno::ENOENT) => Ok(()),
        Err(nix::errno::Errno::ENOTDIR) => other().context(|| format!("mask {path}")),
        Err(e) => Err(JailError::sys(format!("mask {path}"), e.into())),
    }
}

fn open_in_root(root: &OwnedFd, path: &str, flags: OFlag) -> nix::Result<OwnedFd> {
    let flags = rustix::fs::OFlags::from_bits_retain((flags | OFlag::O_CLOEXEC).bits() as u32);
    let resolve = rustix::fs::ResolveFlags::IN_ROOT | rustix::fs::ResolveFlags::NO_MAGICLINKS;
    crate::resolve::openat2(root, path, flags, rustix::fs::Mode::empty(), resolve)
        .map_err(|e| nix::errno::Errno::from_raw(e.raw_os_error()))
}

/// The new root while it is built. Directory descriptors are resolved inside it
/// (`RESOLVE_IN_ROOT`) once and cached, so each directory is walked once rather than
/// from `/` for every entry. A mount on a path hides what cached descriptors at or
/// below it point to, so [`Tree::mounted`] drops those.
struct Tree {
    root: OwnedFd,
    dirs: HashMap<String, OwnedFd>,
    /// How many generated files were written so far (their names in scratch).
    generated: usize,
    /// Directories where a read-only tree was bound (each with a trailing `/`).
    /// Nothing can be created below them, so a mount point there must exist already
    /// (the cached /etc brings its own).
    read_only: Vec<String>,
}

impl Tree {
    /// The directory at `path`, created (with `mode`) along with missing parents.
    fn dir(&mut self, path: &str, mode: u32) -> Result<RawFd, JailError> {
        if path == "/" || path.is_empty() {
            return Ok(self.root.as_raw_fd());
        }
        if let Some(fd) = self.dirs.get(path) {
            return Ok(fd.as_raw_fd());
        }
        let (parent, name) = split(path);
        let parent_fd = self.dir(parent, 0o755)?;
        mkdir_at(parent_fd, name, path, mode)?;
        let fd = open_in_root(&self.root, path, OFlag::O_PATH | OFlag::O_DIRECTORY)
            .context(|| format!("open {path}"))?;
        let raw = fd.as_raw_fd();
        self.dirs.insert(path.to_string(), fd);
        Ok(raw)
    }

    fn parent_of<'p>(&mut self, path: &'p str) -> Result<(RawFd, &'p str), JailError> {
        let (parent, name) = split(path);
        Ok((self.dir(parent, 0o755)?, name))
    }

    /// Opens (creating if needed) the mount point for a bind as an `O_PATH` descriptor.
    fn mount_point(&mut self, path: &str, kind: NodeKind) -> Result<OwnedFd, JailError> {
        let (parent, name) = self.parent_of(path)?;
        if kind == NodeKind::Dir {
            // Not opened as a directory to cache: the mount is about to hide it.
            let in_read_only = self.read_only.iter().any(|dir| path.starts_with(dir));
            if !self.dirs.contains_key(path) && !in_read_only {
                mkdir_at(parent, name, path, 0o755)?;
            }
        } else {
            // Usually a fresh file (a new /dev): the descriptor that made it is the
            // mount point. O_EXCL, so an existing file is never opened for writing
            // (an image's would be copied up) and a symlink there is not followed.
            match nix::fcntl::openat(
                Some(parent),
                name,
                OFlag::O_WRONLY
                    | OFlag::O_CREAT
                    | OFlag::O_EXCL
                    | OFlag::O_NOFOLLOW
                    | OFlag::O_CLOEXEC,
                Mode::from_bits_truncate(0o644),
            ) {
                Ok(fd) => return Ok(unsafe_owned(fd)),
                // An existing file (in a read-only tree too) is a fine mount point as
                // it is: opened below without write access.
                Err(nix::errno::Errno::EEXIST) | Err(nix::errno::Errno::EROFS) => {}
                Err(e) => {
                    return Err(JailError::sys(
                        format!("create mount point {path}"),
                        e.into(),
                    ))
                }
            }
        }
        open_in_root(&self.root, path, OFlag::O_PATH | OFlag::O_NOFOLLOW)
            .context(|| format!("open mount point {path}"))
    }

    /// The file at `path` to mount over, created only if missing. Opened without
    /// write access, so an image's file is not copied up into the upper layer; a
    /// symlink there is followed inside the root (images link resolv.conf elsewhere).
    fn file_over(&mut self, path: &str) -> Result<Option<OwnedFd>, JailError> {
        match open_in_root(&self.root, path, OFlag::O_PATH) {
            Ok(fd) => return Ok(Some(fd)),
            Err(nix::errno::Errno::ENOENT) => {}
            Err(e) => return Err(JailError::sys(format!("open {path}"), e.into())),
        }
        let (parent, name) = self.parent_of(path)?;
        match nix::fcntl::openat(
            Some(parent),
            name,
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o644),
        ) {
            Ok(fd) => drop(unsafe_owned(fd)),
            // A dangling symlink: nothing can be mounted on the link itself, and
            // replacing it would write into the image; leave the image's link alone.
            Err(nix::errno::Errno::ELOOP) => return Ok(None),
            Err(e) => return Err(JailError::sys(format!("create {path}"), e.into())),
        }
        open_in_root(&self.root, path, OFlag::O_PATH | OFlag::O_NOFOLLOW)
            .map(Some)
            .context(|| format!("open {path}"))
    }

    /// Something was mounted at `path`: forget descriptors it now hides.
    fn mounted(&mut self, path: &str) {
        let below = format!("{path}/");
        self.dirs
            .retain(|dir, _| dir != path && !dir.starts_with(&below));
    }
}

/// Creates directory `name` in `parent` (the directory at `path`'s parent), if missing.
fn mkdir_at(parent: RawFd, name: &str, path: &str, mode: u32) -> Result<(), JailError> {
    match nix::sys::stat::mkdirat(Some(parent), name, Mode::from_bits_truncate(mode)) {
        Ok(()) | Err(nix::errno::Errno::EEXIST) => Ok(()),
        Err(nix::errno::Errno::EROFS) => Err(JailError::Setup(format!(
            "cannot create mount point {path}: it lies in a read-only directory"
        ))),
        Err(e) => Err(JailError::sys(format!("mkdir {path}"), e.into())),
    }
}

/// A new file at `path` (never an existing one, nor through a symlink), for writing.
fn create_new(tree: &mut Tree, path: &str, mode: u32) -> Result<OwnedFd, JailError> {
    let (parent, name) = tree.parent_of(path)?;
    let fd = nix::fcntl::openat(
        Some(parent),
        name,
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(mode),
    )
    .context(|| format!("create {path}"))?;
    Ok(unsafe_owned(fd))
}

fn write_file(tree: &mut Tree, path: &str, contents: &[u8], mode: u32) -> Result<(), JailError> {
    let mut file = File::from(create_new(tree, path, mode)?);
    file.write_all(contents).context(|| format!("write {path}"))
}

/// Copies what `source` holds into a new file at `path`, in the kernel. `size` is
/// what the plan saw: a short count at that size is the file's end, which saves
/// asking for the end-of-file read on every copy.
fn copy_file(
    tree: &mut Tree,
    path: &str,
    source: &OwnedFd,
    mode: u32,
    size: u64,
) -> Result<(), JailError> {
    let target = create_new(tree, path, mode)?;
    const CHUNK: usize = 1 << 20;
    let mut copied = 0u64;
    loop {
        match nix::sys::sendfile::sendfile(&target, source, None, CHUNK) {
            Ok(0) => return Ok(()),
            Ok(n) => {
                copied += n as u64;
                // Less than asked for, ending where the plan saw the end: done. A short
                // count anywhere else (a full tmpfs) asks again, for the error or EOF.
                if n < CHUNK && copied == size {
                    return Ok(());
                }
            }
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(JailError::sys(format!("copy {path}"), e.into())),
        }
    }
}

fn split(path: &str) -> (&str, &str) {
    match path.rsplit_once('/') {
        Some(("", name)) => ("/", name),
        Some((parent, name)) => (parent, name),
        None => ("/", path),
    }
}

fn unsafe_owned(fd: std::os::fd::RawFd) -> OwnedFd {
    // SAFETY: only called with descriptors just returned by the kernel to this code.
    unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn copy_plan(source: &Path, untrusted_root: Option<&Path>) -> FsPlan {
        FsPlan {
            layers: Vec::new(),
            ops: vec![FsOp::Copy {
                source: source.to_path_buf(),
                path: "/etc/x".into(),
                mode: 0o644,
                size: 0,
                stamp: Default::default(),
            }],
            scratch_bytes: 0,
            writable: Vec::new(),
            devices: Vec::new(),
            untrusted_root: untrusted_root.map(Path::to_path_buf),
            seed: None,
        }
    }

    fn bind_plan(source: &Path, no_symlinks: bool) -> FsPlan {
        FsPlan {
            ops: vec![FsOp::Bind {
                source: source.to_path_buf(),
                path: "/in".into(),
                kind: NodeKind::Dir,
                access: Access::ReadOnly,
                idmapped: false,
                no_symlinks,
            }],
            ..copy_plan(source, None)
        }
    }

    /// A recipe's copy source is checked to lie inside the recipe's directory when
    /// the recipe loads; whoever can write there may swap it for a symlink to a host
    /// directory before the build step binds it. The bind must then fail, not follow.
    #[test]
    fn a_checked_bind_source_swapped_for_a_symlink_is_refused() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let (recipe, outside) = (root.join("recipe"), root.join("outside"));
        std::fs::create_dir_all(recipe.join("app")).unwrap();
        std::fs::create_dir(&outside).unwrap();
        let source = recipe.join("app");
        assert_eq!(
            open_sources(&bind_plan(&source, true), None, None)
                .unwrap()
                .len(),
            1
        );

        std::fs::rename(&source, recipe.join("app.checked")).unwrap();
        std::os::unix::fs::symlink(&outside, &source).unwrap();
        let err = open_sources(&bind_plan(&source, true), None, None)
            .expect_err("followed a symlink swapped in after the check");
        assert!(err.to_string().contains("symlink"), "{err}");
        // A symlink further up the path is refused too.
        std::fs::remove_file(&source).unwrap();
        std::fs::rename(recipe.join("app.checked"), &source).unwrap();
        std::fs::rename(&recipe, root.join("recipe.checked")).unwrap();
        std::os::unix::fs::symlink(root.join("recipe.checked"), &recipe).unwrap();
        assert!(open_sources(&bind_plan(&source, true), None, None).is_err());
        // Other binds (`brig run --bind`) follow symlinks as they always did.
        assert!(open_sources(&bind_plan(&source, false), None, None).is_ok());
    }

    /// Root brig opens sources for the sandbox; below a `--rootfs` directory, whose
    /// owner could swap a checked file for a symlink to a host secret, it must do so
    /// with the sandbox user's rights, and refuse a symlink outright.
    #[test]
    fn sources_below_an_untrusted_root_are_opened_as_the_sandbox_user() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        let rootfs = tempfile::tempdir().unwrap();
        let secret = rootfs.path().join("secret");
        std::fs::write(&secret, "root only").unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
        let nobody = Some((65534, 65534));
        // Outside an untrusted root (host /etc, explicit binds) root's rights apply.
        assert_eq!(
            open_sources(&copy_plan(&secret, None), None, nobody)
                .unwrap()
                .len(),
            1
        );
        let err = open_sources(&copy_plan(&secret, Some(rootfs.path())), None, nobody)
            .expect_err("opened a root-only file as the sandbox user");
        assert!(err.to_string().contains("Permission denied"), "{err}");
        // Root's rights are back afterwards.
        assert!(std::fs::read(&secret).is_ok());
        let link = rootfs.path().join("link");
        std::os::unix::fs::symlink("/etc/hostname", &link).unwrap();
        assert!(open_sources(&copy_plan(&link, None), None, nobody).is_err());
    }
}
