//! The synthesized /etc of a host-system sandbox, written once on the host and bound
//! read-only into every sandbox that needs the same one.
//!
//! Why: writing /etc into each sandbox's root (some 20 small copies and generated
//! files, a dozen mount points) was on every start's critical path; binding a ready
//! tree instead took the sandbox's filesystem stage from ~1,030 to ~730 µs
//! (BENCHMARKS.md, session 8).
//!
//! Layout: `CACHE/BOOT_ID/KEY/`. KEY is the SHA-256 of every step of the plan's
//! /etc (paths, modes, generated contents, symlink targets, mount points) and, for
//! each host file copied in, its device, inode, size and change time: a write to
//! that file, or its replacement, makes a new key. Entries belong to one boot: one
//! written before a crash may hold data that never reached the disk, so another
//! boot never uses it, and the first build after a reboot removes the old boot's.
//!
//! An entry in use is held with a shared `flock` for as long as its sandbox lives
//! (by `brig run`, or by a session's init). Past [`MAX_ENTRIES`], a build evicts the
//! oldest entries it can lock exclusively, so an entry is never removed under a
//! sandbox that binds it: unlinking its files would change that sandbox's /etc.
//!
//! Only root's runs use it: the cache directory must belong to the caller and be
//! writable by nobody else. Anything unexpected (a read-only /run, a foreign owner)
//! leaves the plan as it was: the sandbox then writes its /etc itself.

use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use rustix::fs::{FlockOperation, Mode, OFlags};
use sha2::{Digest, Sha256};

use crate::fsplan::{Access, FileStamp, FsOp, FsPlan, NodeKind};

/// Entries kept per boot before a build evicts the oldest unused ones.
pub const MAX_ENTRIES: usize = 32;

/// A build's temporary directory older than this was left by a killed brig.
const STALE_BUILD_SECS: u64 = 600;

/// Host files over this size stay bound rather than copied into an entry.
const COPY_LIMIT_BYTES: u64 = 1 << 20;

/// Bumped when the layout of an entry changes, so old entries are never reused.
const FORMAT: &str = "brig-etc-1";

/// The shared lock on the entry a sandbox binds. Dropping it lets eviction take the
/// entry; a session's init keeps a copy of the descriptor for the session's life.
#[derive(Debug)]
pub struct EtcLease {
    entry: OwnedFd,
}

impl EtcLease {
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.entry.as_fd()
    }
}

/// Replaces the steps that write `plan`'s /etc by one read-only bind of a cached
/// tree, built now if this host has none that fits. `None` (plan untouched) when
/// the plan's /etc cannot be cached or the cache cannot be used; why is logged.
pub fn apply(plan: &mut FsPlan, user_binds: &[String], cache: &Path) -> Option<EtcLease> {
    let tree = EtcTree::from_plan(plan, user_binds)?;
    match tree.lease(cache) {
        Ok((entry, lease)) => {
            tree.rewrite(plan, entry);
            Some(lease)
        }
        Err(e) => {
            tracing::debug!("/etc cache at {} not used: {e}", cache.display());
            None
        }
    }
}

/// One thing in the tree, in plan order: one of the plan's own steps that writes
/// the tree (a directory, symlink, written file or host file copy), or the empty
/// directory or file a later mount of the plan lands on.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Node {
    Step(FsOp),
    MountPoint { path: String, kind: NodeKind },
}

impl Node {
    /// Adds this node to the key: each field length-prefixed, so no two different
    /// trees feed the same bytes. A copy counts with the version of the host file
    /// the plan saw, not its contents: those are read only when an entry is built.
    fn feed(&self, key: &mut Sha256) {
        let mut field = |bytes: &[u8]| {
            key.update((bytes.len() as u64).to_le_bytes());
            key.update(bytes);
        };
        let kind_name = |kind: &NodeKind| match kind {
            NodeKind::Dir => b"dir".as_slice(),
            NodeKind::File => b"file".as_slice(),
        };
        match self {
            Node::Step(FsOp::Dir { path, mode }) => {
                field(b"dir");
                field(path.as_bytes());
                field(&mode.to_le_bytes());
            }
            Node::Step(FsOp::Symlink { path, target }) => {
                field(b"symlink");
                field(path.as_bytes());
                field(target.as_os_str().as_encoded_bytes());
            }
            Node::Step(FsOp::File {
                path,
                contents,
                mode,
            }) => {
                field(b"file");
                field(path.as_bytes());
                field(contents);
                field(&mode.to_le_bytes());
            }
            Node::Step(FsOp::Copy {
                source,
                path,
                mode,
                stamp,
                ..
            }) => {
                field(b"copy");
                field(path.as_bytes());
                field(source.as_os_str().as_encoded_bytes());
                field(&mode.to_le_bytes());
                for value in [
                    stamp.dev,
                    stamp.ino,
                    stamp.size,
                    stamp.ctime_sec as u64,
                    stamp.ctime_nsec as u64,
                ] {
                    field(&value.to_le_bytes());
                }
            }
            // `from_plan` makes no other step a node.
            Node::Step(_) => unreachable!("not a step that writes the tree"),
            Node::MountPoint { path, kind } => {
                field(b"mount point");
                field(path.as_bytes());
                field(kind_name(kind));
            }
        }
    }
}

/// The plan's /etc as a tree to cache: which steps it replaces, and its key.
struct EtcTree {
    nodes: Vec<Node>,
    /// Indices of the plan steps the entry replaces (the first is the /etc dir).
    replaced: Vec<usize>,
    key: String,
}

impl EtcTree {
    /// Reads the /etc steps out of `plan`. `None` when there is nothing to cache or
    /// a step cannot be cached (a tmpfs or a scratch dir mounted under /etc).
    fn from_plan(plan: &FsPlan, user_binds: &[String]) -> Option<EtcTree> {
        let under_etc = |path: &str| path == "/etc" || path.starts_with("/etc/");
        let first = plan
            .ops
            .iter()
            .position(|op| matches!(op, FsOp::Dir { path, .. } if path == "/etc"))?;
        let mut nodes = Vec::new();
        let mut replaced = Vec::new();
        let mut key = Sha256::new();
        key.update(FORMAT);
        let mut mounted: Vec<&str> = Vec::new();
        for (index, op) in plan.ops.iter().enumerate().skip(first) {
            let path = op.path();
            if !under_etc(path) {
                continue;
            }
            // A step below a mount lands in what is mounted there, not in the tree.
            if mounted.iter().any(|m| {
                path.strip_prefix(m)
                    .is_some_and(|rest| rest.starts_with('/'))
            }) {
                return None;
            }
            // The node, and whether it replaces the step (a mount point does not).
            let (node, replaces) = match op {
                FsOp::Dir { .. } | FsOp::Symlink { .. } | FsOp::File { .. } | FsOp::Copy { .. } => {
                    (Node::Step(op.clone()), true)
                }
                // A host file the plan binds because it is large: copied into the
                // entry instead (paid once), unless the caller asked for the bind.
                FsOp::Bind {
                    source,
                    path,
                    kind: NodeKind::File,
                    access: Access::ReadOnly,
                    idmapped: false,
                    no_symlinks: false,
                } if !user_binds.contains(path) => match copyable(source) {
                    Some(meta) => {
                        let copy = FsOp::Copy {
                            source: source.clone(),
                            path: path.clone(),
                            mode: meta.mode() & 0o755,
                            size: meta.size(),
                            stamp: FileStamp::of(&meta),
                        };
                        (Node::Step(copy), true)
                    }
                    None => {
                        mounted.push(path);
                        let node = Node::MountPoint {
                            path: path.clone(),
                            kind: NodeKind::File,
                        };
                        (node, false)
                    }
                },
                FsOp::Bind { path, kind, .. } => {
                    mounted.push(path);
                    let node = Node::MountPoint {
                        path: path.clone(),
                        kind: *kind,
                    };
                    (node, false)
                }
                _ => return None,
            };
            node.feed(&mut key);
            nodes.push(node);
            if replaces {
                replaced.push(index);
            }
        }
        let key = key.finalize().iter().map(|b| format!("{b:02x}")).collect();
        Some(EtcTree {
            nodes,
            replaced,
            key,
        })
    }

    /// The entry for this tree, built if missing, and the shared lock on it.
    fn lease(&self, cache: &Path) -> std::io::Result<(PathBuf, EtcLease)> {
        check_owned(cache)?;
        // Every run comes here: the common case (the entry exists) costs a handful
        // of system calls, before the sandbox is cloned.
        let boot = cache.join(boot_id()?);
        let entry = boot.join(&self.key);
        if let Some(lease) = lock_shared(&entry)? {
            return Ok((entry, lease));
        }
        make_boot_dir(cache, &boot)?;
        for _ in 0..3 {
            self.build(&boot)?;
            if let Some(lease) = lock_shared(&entry)? {
                return Ok((entry, lease));
            }
        }
        Err(std::io::Error::other("the entry kept disappearing"))
    }

    /// Writes the tree under a temporary name and renames it into place: a reader
    /// sees a whole entry or none. A concurrent build of the same key wins the race
    /// harmlessly (the loser removes its copy).
    fn build(&self, boot: &Path) -> std::io::Result<()> {
        let staging = boot.join(format!(".build-{:016x}", crate::ids::random_u64()));
        let result = self.write_tree(&staging).and_then(|()| {
            match std::fs::rename(&staging, boot.join(&self.key)) {
                Ok(()) => Ok(()),
                Err(e)
                    if e.raw_os_error() == Some(libc::ENOTEMPTY)
                        || e.raw_os_error() == Some(libc::EEXIST) =>
                {
                    std::fs::remove_dir_all(&staging)
                }
                Err(e) => Err(e),
            }
        });
        if result.is_err() {
            let _ = std::fs::remove_dir_all(&staging);
        }
        result?;
        evict(boot, &self.key);
        Ok(())
    }

    fn write_tree(&self, root: &Path) -> std::io::Result<()> {
        let at = |path: &str| root.join(path.trim_start_matches("/etc").trim_start_matches('/'));
        let set_mode = |path: &Path, mode: u32| {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        };
        for node in &self.nodes {
            match node {
                Node::Step(FsOp::Dir { path, mode }) => {
                    let dir = at(path);
                    if !dir.is_dir() {
                        std::fs::DirBuilder::new().mode(*mode).create(&dir)?;
                    }
                    // Not the umask's: the mode the plan asked for.
                    set_mode(&dir, *mode)?;
                }
                Node::Step(FsOp::Symlink { path, target }) => {
                    std::os::unix::fs::symlink(target, at(path))?
                }
                Node::Step(FsOp::File {
                    path,
                    contents,
                    mode,
                }) => {
                    new_file(&at(path), *mode)?.write_all(contents)?;
                    set_mode(&at(path), *mode)?;
                }
                Node::Step(FsOp::Copy {
                    path, source, mode, ..
                }) => {
                    // The plan saw a regular file: a symlink there now is refused.
                    let mut from = std::fs::OpenOptions::new()
                        .read(true)
                        .custom_flags(libc::O_NOFOLLOW)
                        .open(source)?;
                    let mut contents = Vec::new();
                    (&mut from)
                        .take(COPY_LIMIT_BYTES + 1)
                        .read_to_end(&mut contents)?;
                    if contents.len() as u64 > COPY_LIMIT_BYTES {
                        return Err(std::io::Error::other(format!(
                            "{} grew past the copy limit",
                            source.display()
                        )));
                    }
                    new_file(&at(path), *mode)?.write_all(&contents)?;
                    set_mode(&at(path), *mode)?;
                }
                Node::MountPoint { path, kind } => {
                    let point = at(path);
                    if let Some(parent) = point.parent() {
                        std::fs::DirBuilder::new()
                            .recursive(true)
                            .mode(0o755)
                            .create(parent)?;
                    }
                    match kind {
                        NodeKind::Dir => std::fs::DirBuilder::new().mode(0o755).create(&point)?,
                        NodeKind::File => drop(new_file(&point, 0o444)?),
                    }
                }
                Node::Step(_) => unreachable!("not a step that writes the tree"),
            }
        }
        Ok(())
    }

    /// Drops the replaced steps from `plan` and binds `entry` at /etc in their place.
    fn rewrite(&self, plan: &mut FsPlan, entry: PathBuf) {
        let first = self.replaced[0];
        let mut index = 0;
        plan.ops.retain(|_| {
            let keep = index == first || !self.replaced.contains(&index);
            index += 1;
            keep
        });
        plan.ops[first] = FsOp::Bind {
            source: entry,
            path: "/etc".into(),
            kind: NodeKind::Dir,
            access: Access::ReadOnly,
            idmapped: false,
            no_symlinks: false,
        };
    }
}

/// The metadata of a regular file everybody may read, small enough to copy into an
/// entry; `None` for anything else.
fn copyable(source: &Path) -> Option<std::fs::Metadata> {
    std::fs::symlink_metadata(source).ok().filter(|m| {
        m.file_type().is_file() && m.mode() & 0o004 != 0 && m.size() <= COPY_LIMIT_BYTES
    })
}

fn new_file(path: &Path, mode: u32) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

/// Checks that nobody but the caller can change what is in the cache; creates it
/// if missing.
fn check_owned(cache: &Path) -> std::io::Result<()> {
    let meta = match std::fs::symlink_metadata(cache) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(cache)?;
            std::fs::symlink_metadata(cache)?
        }
        other => other?,
    };
    if !meta.is_dir()
        || meta.uid() != rustix::process::geteuid().as_raw()
        || meta.mode() & 0o022 != 0
    {
        return Err(std::io::Error::other(
            "it is not a directory that only this user can write",
        ));
    }
    Ok(())
}

/// This boot's id (a UUID), read with one open and one read.
fn boot_id() -> std::io::Result<String> {
    let file = rustix::fs::open(
        "/proc/sys/kernel/random/boot_id",
        OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let mut buf = [0u8; 64];
    let n = rustix::io::read(&file, &mut buf)?;
    let id = std::str::from_utf8(&buf[..n])
        .map_err(std::io::Error::other)?
        .trim();
    if id.is_empty() || id.contains('/') || id.starts_with('.') {
        return Err(std::io::Error::other("unexpected boot id"));
    }
    Ok(id.to_string())
}

/// Creates `boot` (this boot's directory) if missing; the first time, removes
/// what earlier boots left: no sandbox of theirs can still be running.
fn make_boot_dir(cache: &Path, boot: &Path) -> std::io::Result<()> {
    match std::fs::DirBuilder::new().mode(0o700).create(boot) {
        Ok(()) => {
            for stale in std::fs::read_dir(cache)?.flatten() {
                if stale.path() != boot {
                    let _ = std::fs::remove_dir_all(stale.path());
                }
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

/// Opens `entry` and takes the shared lock on it. `None` if there is no such entry,
/// or it is being evicted: eviction locks it exclusively and takes all access away
/// (mode 0) before it moves it, so a lock taken on an entry that was evicted
/// meanwhile shows in the mode.
fn lock_shared(entry: &Path) -> std::io::Result<Option<EtcLease>> {
    let dir = match rustix::fs::open(
        entry,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    match rustix::fs::flock(&dir, FlockOperation::NonBlockingLockShared) {
        Ok(()) => {}
        Err(rustix::io::Errno::WOULDBLOCK) => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let held = rustix::fs::fstat(&dir)?;
    if held.st_mode & 0o777 == 0 {
        return Ok(None);
    }
    if held.st_uid != rustix::process::geteuid().as_raw() || held.st_mode & 0o022 != 0 {
        return Err(std::io::Error::other(
            "an entry that someone else could change",
        ));
    }
    Ok(Some(EtcLease { entry: dir }))
}

/// Removes the oldest entries past [`MAX_ENTRIES`] that no sandbox holds, and builds
/// left behind by a killed brig. Best effort: a failure leaves an entry for later.
fn evict(boot: &Path, keep: &str) {
    let Ok(listing) = std::fs::read_dir(boot) else {
        return;
    };
    let now = std::time::SystemTime::now();
    let mut entries = Vec::new();
    for item in listing.flatten() {
        let name = item.file_name().to_string_lossy().into_owned();
        let Ok(meta) = item.metadata() else { continue };
        let modified = meta.modified().unwrap_or(now);
        if name.starts_with('.') {
            let age = now.duration_since(modified).unwrap_or_default();
            if age.as_secs() > STALE_BUILD_SECS {
                let _ = std::fs::remove_dir_all(item.path());
            }
        } else if name != keep {
            entries.push((modified, name));
        }
    }
    // The entry just built counts too.
    let excess = (entries.len() + 1).saturating_sub(MAX_ENTRIES);
    entries.sort();
    let mut removed = 0;
    for (_, name) in entries {
        if removed == excess {
            break;
        }
        let Ok(entry) = rustix::fs::open(
            boot.join(&name),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) else {
            continue;
        };
        if rustix::fs::flock(&entry, FlockOperation::NonBlockingLockExclusive).is_err() {
            // A sandbox binds it.
            continue;
        }
        // Marked first: whoever opened it before the move sees the mark once locked.
        if rustix::fs::fchmod(&entry, Mode::empty()).is_err() {
            continue;
        }
        let doomed = boot.join(format!(".evict-{:016x}", crate::ids::random_u64()));
        if std::fs::rename(boot.join(&name), &doomed).is_ok() {
            let _ = std::fs::remove_dir_all(&doomed);
            removed += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use brig_policy::SandboxSpec;

    /// A fake host with an /etc of a few files, a directory and a large file.
    fn fake_host() -> tempfile::TempDir {
        let host = tempfile::tempdir().unwrap();
        let p = host.path();
        for dir in ["usr/bin", "etc/ssl/certs", "etc/alternatives", "dev"] {
            std::fs::create_dir_all(p.join(dir)).unwrap();
        }
        std::fs::write(p.join("etc/debian_version"), "12.0\n").unwrap();
        std::fs::write(p.join("etc/ssl/openssl.cnf"), "cnf").unwrap();
        std::fs::write(p.join("etc/mime.types"), vec![b'#'; 40 << 10]).unwrap();
        std::os::unix::fs::symlink("/usr/share/zoneinfo/UTC", p.join("etc/localtime")).unwrap();
        host
    }

    fn plan(host: &Path) -> FsPlan {
        crate::fsplan::plan(&SandboxSpec::new(vec!["true".into()]), host).unwrap()
    }

    fn etc_ops(plan: &FsPlan) -> Vec<&FsOp> {
        plan.ops
            .iter()
            .filter(|op| op.path() == "/etc" || op.path().starts_with("/etc/"))
            .collect()
    }

    #[test]
    fn the_etc_steps_become_one_bind_of_a_complete_entry() {
        let host = fake_host();
        let cache = tempfile::tempdir().unwrap();
        let mut plan = plan(host.path());
        let before = plan.ops.len();
        let lease = apply(&mut plan, &[], cache.path()).expect("cached");

        let etc = etc_ops(&plan);
        let FsOp::Bind {
            source,
            kind: NodeKind::Dir,
            access: Access::ReadOnly,
            ..
        } = etc[0]
        else {
            panic!("/etc is not a read-only bind: {:?}", etc[0]);
        };
        // Only the directory binds stay, on mount points the entry holds.
        assert!(etc[1..].iter().all(|op| matches!(
            op,
            FsOp::Bind {
                kind: NodeKind::Dir,
                ..
            }
        )));
        assert!(plan.ops.len() < before);
        assert!(source.join("ssl/certs").is_dir());
        assert!(source.join("alternatives").is_dir());
        assert_eq!(
            std::fs::read(source.join("ssl/openssl.cnf")).unwrap(),
            b"cnf"
        );
        // Past the sandbox's own copy limit, but copied into the entry once.
        assert_eq!(
            std::fs::metadata(source.join("mime.types")).unwrap().len(),
            40 << 10
        );
        assert!(std::fs::read_to_string(source.join("passwd"))
            .unwrap()
            .contains("sandbox:x:1000:1000"));
        assert_eq!(
            std::fs::read_link(source.join("localtime")).unwrap(),
            Path::new("/usr/share/zoneinfo/UTC")
        );
        assert_eq!(
            std::fs::read_link(source.join("mtab")).unwrap(),
            Path::new("/proc/self/mounts")
        );
        let mode = |name: &str| std::fs::metadata(source.join(name)).unwrap().mode() & 0o7777;
        assert_eq!(mode("passwd"), 0o644);
        assert_eq!(mode("ssl"), 0o755);
        assert_eq!(mode(""), 0o755);
        drop(lease);

        // The same plan again uses the same entry.
        let mut again =
            crate::fsplan::plan(&SandboxSpec::new(vec!["true".into()]), host.path()).unwrap();
        let _lease = apply(&mut again, &[], cache.path()).unwrap();
        assert_eq!(etc_ops(&again)[0], etc[0]);
        let boot = source.parent().unwrap();
        assert_eq!(std::fs::read_dir(boot).unwrap().count(), 1);
    }

    #[test]
    fn a_changed_host_file_or_sandbox_user_gets_a_new_entry() {
        let host = fake_host();
        let cache = tempfile::tempdir().unwrap();
        let source_of = |plan: &FsPlan| match etc_ops(plan)[0] {
            FsOp::Bind { source, .. } => source.clone(),
            other => panic!("not cached: {other:?}"),
        };
        let mut first = plan(host.path());
        let _a = apply(&mut first, &[], cache.path()).unwrap();

        // Rewritten in place with the same size: its change time tells.
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(host.path().join("etc/debian_version"), "13.0\n").unwrap();
        let mut second = plan(host.path());
        let _b = apply(&mut second, &[], cache.path()).unwrap();
        assert_ne!(source_of(&first), source_of(&second));
        assert_eq!(
            std::fs::read_to_string(source_of(&second).join("debian_version")).unwrap(),
            "13.0\n"
        );

        let mut spec = SandboxSpec::new(vec!["true".into()]);
        spec.identity.uid = 1234;
        let mut third = crate::fsplan::plan(&spec, host.path()).unwrap();
        let _c = apply(&mut third, &[], cache.path()).unwrap();
        assert!(std::fs::read_to_string(source_of(&third).join("passwd"))
            .unwrap()
            .contains(":1234:"));
        assert_ne!(source_of(&third), source_of(&second));
    }

    #[test]
    fn a_user_bind_under_etc_stays_a_bind_on_a_mount_point() {
        let host = fake_host();
        let cache = tempfile::tempdir().unwrap();
        let mut spec = SandboxSpec::new(vec!["true".into()]);
        spec.filesystem.binds.push(brig_policy::BindMount {
            // Resolved against the fake host's root by the plan.
            source: "/etc/debian_version".into(),
            target: "/etc/custom".into(),
            writable: false,
            idmapped: false,
            no_symlinks: false,
        });
        let mut plan = crate::fsplan::plan(&spec, host.path()).unwrap();
        let _lease = apply(&mut plan, &["/etc/custom".to_string()], cache.path()).unwrap();
        let etc = etc_ops(&plan);
        let FsOp::Bind { source: entry, .. } = etc[0] else {
            panic!("not cached")
        };
        assert!(etc.iter().any(|op| matches!(op,
            FsOp::Bind { path, kind: NodeKind::File, .. } if path == "/etc/custom")));
        assert_eq!(std::fs::metadata(entry.join("custom")).unwrap().len(), 0);
    }

    #[test]
    fn eviction_skips_entries_in_use_and_removes_stale_builds() {
        let cache = tempfile::tempdir().unwrap();
        let boot = cache.path().join("boot");
        std::fs::create_dir(&boot).unwrap();
        let mut leases = Vec::new();
        for i in 0..MAX_ENTRIES + 4 {
            let name = format!("{i:04}");
            std::fs::create_dir(boot.join(&name)).unwrap();
            // Oldest first, by modification time.
            let when = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(i as u64);
            std::fs::File::open(boot.join(&name))
                .unwrap()
                .set_modified(when)
                .unwrap();
            if i < 2 {
                leases.push(lock_shared(&boot.join(&name)).unwrap().expect("lockable"));
            }
        }
        let stale = boot.join(".build-stale");
        std::fs::create_dir(&stale).unwrap();
        std::fs::File::open(&stale)
            .unwrap()
            .set_modified(std::time::SystemTime::UNIX_EPOCH)
            .unwrap();
        let fresh = boot.join(".build-fresh");
        std::fs::create_dir(&fresh).unwrap();

        evict(&boot, "new");
        let left: Vec<String> = std::fs::read_dir(&boot)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        // The two held ones stay although oldest; the next five oldest go.
        assert!(left.contains(&"0000".to_string()) && left.contains(&"0001".to_string()));
        for gone in ["0002", "0003", "0004", "0005", "0006"] {
            assert!(!left.contains(&gone.to_string()), "{gone} kept: {left:?}");
        }
        assert!(left.contains(&"0007".to_string()));
        assert!(!left.contains(&".build-stale".to_string()));
        assert!(left.contains(&".build-fresh".to_string()));

        // Held entries can still be shared; a missing one is a miss.
        assert!(lock_shared(&boot.join("0000")).unwrap().is_some());
        assert!(lock_shared(&boot.join("missing")).unwrap().is_none());
    }

    #[test]
    fn a_cache_others_can_write_is_not_used() {
        let host = fake_host();
        let cache = tempfile::tempdir().unwrap();
        std::fs::set_permissions(cache.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let mut plan = plan(host.path());
        let before = plan.clone();
        assert!(apply(&mut plan, &[], cache.path()).is_none());
        assert_eq!(plan, before);
    }

    #[test]
    fn entries_of_another_boot_are_removed_on_the_first_use_in_this_one() {
        let host = fake_host();
        let cache = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(cache.path().join("old-boot/abc")).unwrap();
        let mut plan = plan(host.path());
        let _lease = apply(&mut plan, &[], cache.path()).unwrap();
        let names: Vec<_> = std::fs::read_dir(cache.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, vec![boot_id().unwrap()]);
    }

    #[test]
    fn an_entry_evicted_between_open_and_lock_is_a_miss() {
        let cache = tempfile::tempdir().unwrap();
        let entry = cache.path().join("entry");
        std::fs::create_dir(&entry).unwrap();
        // What eviction leaves on an entry before it moves it.
        std::fs::set_permissions(&entry, std::fs::Permissions::from_mode(0o000)).unwrap();
        assert!(lock_shared(&entry).unwrap().is_none());
    }
}
