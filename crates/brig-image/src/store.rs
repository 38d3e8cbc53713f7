//! The on-disk image store (layout in docs/IMAGES.md).
//!
//! ```text
//! <store>/
//!   lock                 flock: shared by every writer and by runs resolving an image,
//!                        exclusive by gc, so gc never sees a half-made commit
//!   layers/<hex>.erofs   one read-only layer, named by its content digest
//!   layers/<hex>.json    its record: digest, file sha256 and size, when it was made
//!   images/<name>.json   an image: its layers (bottom first) and run config
//!   mnt/<hex>/           where a layer is mounted, once per host
//!   tmp/<work>/          work in progress; a directory nobody holds a lock on is
//!                        debris of a crash and is removed when the store is opened
//! ```
//!
//! Every file is written under tmp/ and renamed into place, so a reader sees the old
//! state or the new one, never a part. A layer is committed before any image names
//! it; an interrupted import leaves at most an unreferenced layer, which gc removes.
//!
//! A running sandbox holds a shared flock on each of its layer files; gc removes a
//! layer only under an exclusive, non-blocking flock, so a layer in use stays.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use rustix::fs::FlockOperation;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::error::{ImageError, IoContext, Result};
use crate::pack;
use crate::progress::Progress;
use crate::{tree, ImageConfig};

/// The default store, for brig running as root.
pub const DEFAULT_STORE: &str = "/var/lib/brig";

/// A `--store` argument as an absolute path (a clap value parser for every command
/// that takes one): the store's paths (its layers' mount points) end up in sandbox
/// specs, whose host paths must be absolute. The store may not exist yet, so it is
/// not canonicalized.
pub fn absolute_store_path(text: &str) -> std::result::Result<PathBuf, String> {
    std::path::absolute(text).map_err(|e| format!("'{text}': {e}"))
}

/// A layer's record, stored beside its file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayerRecord {
    /// `sha256:<hex>`: the canonical digest of the layer's tree (see `tree::digest`).
    pub digest: String,
    /// sha256 of the layer file's bytes, checked before the layer is first mounted.
    pub file_sha256: String,
    pub file_bytes: u64,
    /// Always "erofs" so far.
    pub format: String,
    pub created_unix: u64,
}

/// An image: a stack of layers and how to run it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageRecord {
    pub name: String,
    /// Layer digests, bottom first.
    pub layers: Vec<String>,
    #[serde(default)]
    pub config: ImageConfig,
    pub created_unix: u64,
    /// Where it came from: "import <source>", "build <recipe>", "snapshot of <image>".
    #[serde(default)]
    pub origin: String,
    #[serde(default, skip_serializing_if = "ImageKind::is_root")]
    pub kind: ImageKind,
}

/// What an image's layers hold.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ImageKind {
    /// A root filesystem.
    #[default]
    Root,
    /// One layer with the private directories of a sandbox on the host's system
    /// dirs (`tmp/`, `workspace/`): a snapshot that seeds a new sandbox's /tmp and
    /// /workspace (`Filesystem::seed`), not a root.
    Scratch,
}

impl ImageKind {
    fn is_root(&self) -> bool {
        *self == ImageKind::Root
    }
}

impl ImageRecord {
    /// Fails unless the image is a root filesystem a sandbox can run from.
    pub fn check_root(&self) -> Result<()> {
        match self.kind {
            ImageKind::Root => Ok(()),
            ImageKind::Scratch => Err(ImageError::Unsupported(format!(
                "image {} is a snapshot of a session's /tmp and /workspace, not a root filesystem: start a session from that snapshot instead",
                self.name
            ))),
        }
    }
}

pub struct Store {
    root: PathBuf,
}

/// Held while a sandbox runs from an image: shared locks on its layer files.
pub struct LayersInUse {
    _files: Vec<File>,
    /// Where each layer is mounted, bottom first.
    pub mounts: Vec<PathBuf>,
}

impl LayersInUse {
    /// The open layer files whose shared locks keep gc away, for a process that
    /// must hold them longer than this value lives (a session's init).
    pub fn into_locks(self) -> Vec<File> {
        self._files
    }
}

/// How many fresh names [`Store::work_dir`] tries when stores opened meanwhile keep
/// removing its new lock file (each takes a few microseconds of bad luck).
const WORK_DIR_ATTEMPTS: usize = 16;

/// A private work directory under tmp/, removed when dropped.
pub struct WorkDir {
    path: PathBuf,
    _lock: File,
}

impl WorkDir {
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = remove_tree(&self.path);
        // Still holding the lock, so no one mistakes the pair for debris meanwhile.
        let _ = fs::remove_file(self.path.with_extension("lock"));
    }
}

/// What gc did.
#[derive(Debug, Default, Serialize)]
pub struct GcReport {
    pub removed_layers: Vec<String>,
    pub freed_bytes: u64,
    pub unmounted: Vec<String>,
    /// Unreferenced layers kept because a sandbox is using them.
    pub in_use: Vec<String>,
}

pub fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Refuses a layer count no sandbox could stack (see [`check_stackable`]).
pub fn check_layer_count(count: usize) -> Result<()> {
    if count == 0 {
        return Err(ImageError::Unsupported(
            "an image needs at least one layer".into(),
        ));
    }
    if count > brig_policy::MAX_LAYERS {
        return Err(ImageError::Unsupported(format!(
            "the image has {count} layers; brig stacks at most {}",
            brig_policy::MAX_LAYERS
        )));
    }
    Ok(())
}

/// Refuses layers no sandbox could stack, so that no stored image is one `brig run`
/// refuses: overlayfs takes 1 to [`brig_policy::MAX_LAYERS`] lower layers and
/// refuses the same one twice (each layer is mounted once per host).
pub fn check_stackable(layers: &[String]) -> Result<()> {
    check_layer_count(layers.len())?;
    let mut seen = std::collections::HashSet::with_capacity(layers.len());
    if let Some(twice) = layers.iter().find(|digest| !seen.insert(*digest)) {
        return Err(ImageError::Unsupported(format!(
            "the image has layer {twice} twice, which overlayfs cannot stack"
        )));
    }
    Ok(())
}

/// Checks an image name: it becomes a file name (with '/' and ':' escaped).
pub fn validate_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && !name.starts_with(['.', '-'])
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | ':' | '/'));
    if ok {
        Ok(())
    } else {
        Err(ImageError::BadName(format!("{name:?}")))
    }
}

fn name_to_file(name: &str) -> String {
    name.replace('%', "%25")
        .replace('/', "%2F")
        .replace(':', "%3A")
}

/// The name [`name_to_file`] escaped; `None` for a file name it cannot have made.
fn file_to_name(file: &str) -> Option<String> {
    let mut name = String::with_capacity(file.len());
    let mut rest = file;
    while let Some(at) = rest.find('%') {
        name.push_str(&rest[..at]);
        let escaped = match rest.get(at..at + 3)? {
            "%25" => '%',
            "%2F" => '/',
            "%3A" => ':',
            _ => return None,
        };
        name.push(escaped);
        rest = &rest[at + 3..];
    }
    name.push_str(rest);
    validate_name(&name).ok().map(|()| name)
}

fn hex_of(digest: &str) -> Result<&str> {
    let hex = digest
        .strip_prefix("sha256:")
        .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        .ok_or_else(|| ImageError::CorruptLayer {
            digest: digest.to_string(),
            reason: "not a sha256 digest".into(),
        })?;
    Ok(hex)
}

impl Store {
    /// Opens (creating if needed) the store at `root` and clears debris of crashed work.
    pub fn open(root: impl Into<PathBuf>) -> Result<Store> {
        let root = root.into();
        for dir in ["", "layers", "images", "mnt", "tmp"] {
            let path = root.join(dir);
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&path)
                .context(|| format!("create store directory {}", path.display()))?;
        }
        let store = Store { root };
        store.clear_debris();
        Ok(store)
    }

    /// The store at `root` as it is, for lookups: unlike [`Store::open`] nothing is
    /// created or cleared, so it is cheap enough to call per request (a store not
    /// made yet has no images).
    pub fn at(root: impl Into<PathBuf>) -> Store {
        Store { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn lock_file(&self) -> Result<File> {
        OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(self.root.join("lock"))
            .context(|| format!("open {}", self.root.join("lock").display()))
    }

    /// A shared lock on the store: writers and resolvers hold it, gc excludes them.
    pub fn shared(&self) -> Result<File> {
        let file = self.lock_file()?;
        rustix::fs::flock(&file, FlockOperation::LockShared).context(|| "lock the store".into())?;
        Ok(file)
    }

    fn exclusive(&self) -> Result<File> {
        let file = self.lock_file()?;
        rustix::fs::flock(&file, FlockOperation::LockExclusive)
            .context(|| "lock the store".into())?;
        Ok(file)
    }

    /// Work directories whose owner died (no lock held) are removed, after
    /// detaching anything still mounted in them (a snapshot's attached upper layer
    /// when brig was killed while packing it).
    fn clear_debris(&self) {
        let Ok(entries) = fs::read_dir(self.root.join("tmp")) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let (dir, lock) = if path.extension().is_some_and(|e| e == "lock") {
                (path.with_extension(""), path.clone())
            } else {
                (path.clone(), path.with_extension("lock"))
            };
            // Held until the debris is gone: released earlier, a new owner could lock
            // the file and make its directory just before they are removed.
            let held = File::open(&lock).ok();
            let owner_alive = held.as_ref().is_some_and(|file| {
                rustix::fs::flock(file, FlockOperation::NonBlockingLockExclusive).is_err()
            });
            if owner_alive {
                continue;
            }
            for mount_point in mounts_below(&dir) {
                let _ = rustix::mount::unmount(&mount_point, rustix::mount::UnmountFlags::DETACH);
            }
            let _ = remove_tree(&dir);
            let _ = fs::remove_file(&lock);
            drop(held);
        }
    }

    /// A fresh work directory under tmp/ (same filesystem as the store, so results
    /// can be renamed into place).
    pub fn work_dir(&self, purpose: &str) -> Result<WorkDir> {
        // A store opened by someone else between our creating the lock file and
        // locking it finds it unlocked, takes it for a dead owner's and removes it:
        // the lock we then get is on a file no longer there. So the lock counts only
        // if its file is still the one at the path, else a new name is tried.
        for _ in 0..WORK_DIR_ATTEMPTS {
            let name = format!("{purpose}-{}-{:x}", std::process::id(), random());
            let path = self.root.join("tmp").join(&name);
            let lock_path = path.with_extension("lock");
            let lock = OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .mode(0o600)
                .open(&lock_path)
                .context(|| format!("create {}", lock_path.display()))?;
            rustix::fs::flock(&lock, FlockOperation::LockExclusive)
                .context(|| "lock work directory".into())?;
            let held = rustix::fs::fstat(&lock).context(|| "inspect a lock file".into())?;
            let still_there = fs::metadata(&lock_path)
                .is_ok_and(|now| now.dev() == held.st_dev && now.ino() == held.st_ino);
            if !still_there {
                continue;
            }
            fs::DirBuilder::new()
                .mode(0o700)
                .create(&path)
                .context(|| format!("create {}", path.display()))?;
            return Ok(WorkDir { path, _lock: lock });
        }
        Err(ImageError::Io {
            context: format!(
                "make a work directory in {}: its lock file kept being removed",
                self.root.join("tmp").display()
            ),
            source: std::io::Error::from(std::io::ErrorKind::Interrupted),
        })
    }

    fn layer_file(&self, hex: &str) -> PathBuf {
        self.root.join("layers").join(format!("{hex}.erofs"))
    }

    fn layer_record_path(&self, hex: &str) -> PathBuf {
        self.root.join("layers").join(format!("{hex}.json"))
    }

    fn image_path(&self, name: &str) -> PathBuf {
        self.root
            .join("images")
            .join(format!("{}.json", name_to_file(name)))
    }

    pub fn mount_point(&self, digest: &str) -> Result<PathBuf> {
        Ok(self.root.join("mnt").join(hex_of(digest)?))
    }

    pub fn layer(&self, digest: &str) -> Result<LayerRecord> {
        let hex = hex_of(digest)?;
        let path = self.layer_record_path(hex);
        let text = fs::read_to_string(&path).map_err(|e| ImageError::CorruptLayer {
            digest: digest.to_string(),
            reason: format!("no record at {}: {e}", path.display()),
        })?;
        serde_json::from_str(&text).map_err(|e| ImageError::CorruptLayer {
            digest: digest.to_string(),
            reason: format!("bad record: {e}"),
        })
    }

    pub fn has_layer(&self, digest: &str) -> bool {
        hex_of(digest)
            .is_ok_and(|hex| self.layer_record_path(hex).exists() && self.layer_file(hex).exists())
    }

    /// Packs the tree at `source` into a layer and commits it (a no-op when a layer
    /// with the same digest is already stored). The caller holds [`Store::shared`].
    pub fn commit_layer(
        &self,
        source: &Path,
        options: &pack::PackOptions,
        work: &Path,
        progress: &dyn Progress,
    ) -> Result<LayerRecord> {
        progress.phase("digest", None);
        let digest = tree::digest_excluding(source, &options.exclude, progress)?;
        if self.has_layer(&digest) {
            return self.layer(&digest);
        }
        let hex = hex_of(&digest)?.to_string();
        let staged = work.join(format!("{hex}.erofs"));
        progress.phase("pack", None);
        pack::pack(source, &staged, options, progress)?;
        progress.phase("checksum", None);
        let (file_sha256, file_bytes) = file_sha256(&staged, progress)?;
        let record = LayerRecord {
            digest: digest.clone(),
            file_sha256,
            file_bytes,
            format: "erofs".into(),
            created_unix: now_unix(),
        };
        sync_file(&staged)?;
        // The file first, then its record: a record always has its file.
        fs::rename(&staged, self.layer_file(&hex)).context(|| format!("store layer {digest}"))?;
        self.write_atomically(
            &self.layer_record_path(&hex),
            &serde_json::to_vec_pretty(&record).expect("records serialize"),
            work,
        )?;
        Ok(record)
    }

    fn write_atomically(&self, path: &Path, contents: &[u8], work: &Path) -> Result<()> {
        let staged = work.join(format!("write-{:x}", random()));
        let mut file = File::create(&staged).context(|| format!("create {}", staged.display()))?;
        file.write_all(contents)
            .and_then(|_| file.sync_all())
            .context(|| format!("write {}", staged.display()))?;
        fs::rename(&staged, path).context(|| format!("write {}", path.display()))
    }

    pub fn image(&self, name: &str) -> Result<ImageRecord> {
        validate_name(name)?;
        let path = self.image_path(name);
        let text = match fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(ImageError::NoSuchImage(name.to_string()))
            }
            Err(e) => return Err(ImageError::io(format!("read {}", path.display()), e)),
        };
        serde_json::from_str(&text).map_err(|e| {
            ImageError::BadSource(format!("image record {} is damaged: {e}", path.display()))
        })
    }

    pub fn has_image(&self, name: &str) -> bool {
        self.image_path(name).exists()
    }

    /// Records an image. Every layer must already be committed. Fails if the name is
    /// taken unless `replace`.
    pub fn commit_image(&self, record: &ImageRecord, replace: bool, work: &Path) -> Result<()> {
        validate_name(&record.name)?;
        check_stackable(&record.layers)?;
        for digest in &record.layers {
            if !self.has_layer(digest) {
                return Err(ImageError::CorruptLayer {
                    digest: digest.clone(),
                    reason: "not in the store".into(),
                });
            }
        }
        let path = self.image_path(&record.name);
        if !replace && path.exists() {
            return Err(ImageError::ImageExists(record.name.clone()));
        }
        self.write_atomically(
            &path,
            &serde_json::to_vec_pretty(record).expect("records serialize"),
            work,
        )
    }

    /// The names of the stored images, without reading their records.
    pub fn image_names(&self) -> Result<Vec<String>> {
        let dir = self.root.join("images");
        let mut names = Vec::new();
        for entry in fs::read_dir(&dir).context(|| format!("list {}", dir.display()))? {
            let entry = entry.context(|| format!("list {}", dir.display()))?;
            let file = entry.file_name().to_string_lossy().into_owned();
            if let Some(name) = file.strip_suffix(".json").and_then(file_to_name) {
                names.push(name);
            }
        }
        names.sort();
        Ok(names)
    }

    pub fn images(&self) -> Result<Vec<ImageRecord>> {
        let dir = self.root.join("images");
        let mut images = Vec::new();
        for entry in fs::read_dir(&dir).context(|| format!("list {}", dir.display()))? {
            let entry = entry.context(|| format!("list {}", dir.display()))?;
            if entry.path().extension().is_some_and(|e| e == "json") {
                let text = fs::read_to_string(entry.path())
                    .context(|| format!("read {}", entry.path().display()))?;
                if let Ok(record) = serde_json::from_str::<ImageRecord>(&text) {
                    images.push(record);
                }
            }
        }
        images.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(images)
    }

    pub fn remove_image(&self, name: &str) -> Result<()> {
        self.image(name)?;
        let _lock = self.shared()?;
        fs::remove_file(self.image_path(name)).context(|| format!("remove image {name}"))
    }

    /// Locks the image's layers against gc, mounting (and first verifying) any that
    /// are not mounted yet. Returns the mount points, bottom first.
    pub fn use_layers(&self, image: &ImageRecord) -> Result<LayersInUse> {
        // Stores written before commits checked this hold such images: refused here
        // with the reason, not by the mount that would fail on them.
        check_stackable(&image.layers)?;
        let _store = self.shared()?;
        let mut files = Vec::with_capacity(image.layers.len());
        let mut mounts = Vec::with_capacity(image.layers.len());
        for digest in &image.layers {
            let hex = hex_of(digest)?;
            let path = self.layer_file(hex);
            let file = File::open(&path).map_err(|e| ImageError::CorruptLayer {
                digest: digest.clone(),
                reason: format!("cannot open {}: {e}", path.display()),
            })?;
            rustix::fs::flock(&file, FlockOperation::LockShared)
                .context(|| format!("lock layer {digest}"))?;
            let mount_point = self.mount_point(digest)?;
            self.ensure_mounted(digest, &file, &path, &mount_point)?;
            files.push(file);
            mounts.push(mount_point);
        }
        Ok(LayersInUse {
            _files: files,
            mounts,
        })
    }

    /// Mounts a layer once per host. The first mount checks the file against its
    /// record, so a corrupt or truncated layer is refused with a clear error instead
    /// of failing reads later inside a sandbox.
    fn ensure_mounted(
        &self,
        digest: &str,
        file: &File,
        path: &Path,
        mount_point: &Path,
    ) -> Result<()> {
        if is_mount_point(mount_point) {
            return Ok(());
        }
        // Serializes concurrent first mounts of one layer.
        let guard = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(self.root.join("mnt").join(".lock"))
            .context(|| "open the mount lock".into())?;
        rustix::fs::flock(&guard, FlockOperation::LockExclusive)
            .context(|| "lock layer mounts".into())?;
        if is_mount_point(mount_point) {
            return Ok(());
        }
        let record = self.layer(digest)?;
        let meta = file
            .metadata()
            .context(|| format!("stat {}", path.display()))?;
        if meta.len() != record.file_bytes {
            return Err(ImageError::CorruptLayer {
                digest: digest.into(),
                reason: format!(
                    "file is {} bytes, its record says {}",
                    meta.len(),
                    record.file_bytes
                ),
            });
        }
        let (sha, _) = file_sha256(path, &crate::Silent)?;
        if sha != record.file_sha256 {
            return Err(ImageError::CorruptLayer {
                digest: digest.into(),
                reason: "file contents do not match its checksum".into(),
            });
        }
        fs::DirBuilder::new()
            .mode(0o755)
            .create(mount_point)
            .or_else(|e| {
                if e.kind() == std::io::ErrorKind::AlreadyExists {
                    Ok(())
                } else {
                    Err(e)
                }
            })
            .context(|| format!("create {}", mount_point.display()))?;
        // A loop device keeps the descriptor it is given open while attached; it must
        // not be the one holding this run's lock, or gc could never take the layer.
        let device_file = File::open(path).context(|| format!("open {}", path.display()))?;
        crate::mount::mount_layer(device_file.as_fd(), path, mount_point).map_err(|e| {
            let _ = fs::remove_dir(mount_point);
            match e {
                ImageError::Io { source, .. } => ImageError::CorruptLayer {
                    digest: digest.into(),
                    reason: format!("the kernel refused to mount it: {source}"),
                },
                other => other,
            }
        })
    }

    /// Removes layers no image references (unless a sandbox uses them) and, with
    /// `unmount_idle`, also unmounts referenced layers no sandbox uses.
    pub fn gc(&self, unmount_idle: bool) -> Result<GcReport> {
        let _store = self.exclusive()?;
        let mut referenced = std::collections::BTreeSet::new();
        for image in self.images()? {
            referenced.extend(image.layers);
        }
        let mut report = GcReport::default();
        let dir = self.root.join("layers");
        let mut digests = Vec::new();
        for entry in fs::read_dir(&dir).context(|| format!("list {}", dir.display()))? {
            let entry = entry.context(|| format!("list {}", dir.display()))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(hex) = name
                .strip_suffix(".erofs")
                .or_else(|| name.strip_suffix(".json"))
            {
                let digest = format!("sha256:{hex}");
                if !digests.contains(&digest) {
                    digests.push(digest);
                }
            }
        }
        // Mount points whose layer file is gone (an earlier crash).
        let mnt = self.root.join("mnt");
        for entry in fs::read_dir(&mnt).context(|| format!("list {}", mnt.display()))? {
            let entry = entry.context(|| format!("list {}", mnt.display()))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.len() == 64 {
                let digest = format!("sha256:{name}");
                if !digests.contains(&digest) {
                    digests.push(digest);
                }
            }
        }
        digests.sort();
        for digest in digests {
            let keep = referenced.contains(&digest);
            if (keep && !unmount_idle) || hex_of(&digest).is_err() {
                continue;
            }
            self.release_layer(&digest, keep, &mut report)?;
        }
        Ok(report)
    }

    /// Removes an image and those of its layers that no other image references and
    /// no sandbox uses (those stay for gc): undoes a commit as far as it can be
    /// undone now, without a whole gc.
    pub fn discard_image(&self, name: &str) -> Result<GcReport> {
        let image = self.image(name)?;
        let _store = self.exclusive()?;
        fs::remove_file(self.image_path(name)).context(|| format!("remove image {name}"))?;
        let mut referenced = std::collections::BTreeSet::new();
        for other in self.images()? {
            referenced.extend(other.layers);
        }
        let mut report = GcReport::default();
        for digest in image.layers {
            if !referenced.contains(&digest) && hex_of(&digest).is_ok() {
                self.release_layer(&digest, false, &mut report)?;
            }
        }
        Ok(report)
    }

    /// Under the exclusive lock: unmounts a layer no sandbox uses and, unless
    /// `keep`, removes its files; one a sandbox uses is left alone (and reported
    /// unless kept).
    fn release_layer(&self, digest: &str, keep: bool, report: &mut GcReport) -> Result<()> {
        let hex = hex_of(digest)?;
        let path = self.layer_file(hex);
        let file = File::open(&path).ok();
        if let Some(file) = &file {
            if rustix::fs::flock(file, FlockOperation::NonBlockingLockExclusive).is_err() {
                if !keep {
                    report.in_use.push(digest.to_string());
                }
                return Ok(());
            }
        }
        let mount_point = self.mount_point(digest)?;
        if is_mount_point(&mount_point) {
            crate::mount::unmount_layer(&mount_point)?;
            report.unmounted.push(digest.to_string());
        }
        let _ = fs::remove_dir(&mount_point);
        if keep {
            return Ok(());
        }
        let bytes = fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        let _ = fs::remove_file(self.layer_record_path(hex));
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(ImageError::io(format!("remove {}", path.display()), e)),
        }
        report.freed_bytes += bytes;
        report.removed_layers.push(digest.to_string());
        Ok(())
    }

    /// Total bytes of an image's layer files.
    pub fn image_bytes(&self, image: &ImageRecord) -> u64 {
        image
            .layers
            .iter()
            .filter_map(|d| self.layer(d).ok())
            .map(|l| l.file_bytes)
            .sum()
    }
}

/// Mount points at or below `dir`, deepest first, from /proc/self/mountinfo.
fn mounts_below(dir: &Path) -> Vec<PathBuf> {
    let Ok(info) = fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = info
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(unescape_mountinfo)
        .map(PathBuf::from)
        .filter(|p| p.starts_with(dir))
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found
}

/// mountinfo writes space, tab, newline and backslash as octal escapes.
fn unescape_mountinfo(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 3 < bytes.len() {
            let digits = std::str::from_utf8(&bytes[i + 1..i + 4]).unwrap_or("");
            if let Ok(value) = u8::from_str_radix(digits, 8) {
                out.push(value);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether `path` is a mount point: its device differs from its parent's (the
/// layer's EROFS superblock versus the store's filesystem).
pub fn is_mount_point(path: &Path) -> bool {
    let (Ok(meta), Some(parent)) = (fs::symlink_metadata(path), path.parent()) else {
        return false;
    };
    fs::metadata(parent).is_ok_and(|p| p.dev() != meta.dev())
}

fn file_sha256(path: &Path, progress: &dyn Progress) -> Result<(String, u64)> {
    let mut file = File::open(path).context(|| format!("open {}", path.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let n = file
            .read(&mut buf)
            .context(|| format!("read {}", path.display()))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        total += n as u64;
        progress.advance(n as u64);
    }
    Ok((hex::encode(hasher.finalize()), total))
}

fn sync_file(path: &Path) -> Result<()> {
    File::open(path)
        .and_then(|f| f.sync_all())
        .context(|| format!("sync {}", path.display()))
}

/// Removes a tree without following symlinks; unpacked layers may hold anything.
pub fn remove_tree(path: &Path) -> std::io::Result<()> {
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => {
            // Layers may contain read-only directories; root ignores modes anyway.
            fs::remove_dir_all(path)
        }
        Ok(_) => fs::remove_file(path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

fn random() -> u64 {
    let mut bytes = [0u8; 8];
    if File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .is_err()
    {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        return nanos ^ u64::from(std::process::id());
    }
    u64::from_ne_bytes(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stores opened while others make work directories (every snapshot opens the
    /// store, and opening clears debris): no live work directory is taken for
    /// debris, however the two interleave. A daemon snapshotting 30 sessions at
    /// once lost a work directory this way now and then.
    #[test]
    fn opening_the_store_never_clears_work_in_progress() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        Store::open(&root).unwrap();
        let lost = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    for _ in 0..1500 {
                        let store = Store::open(&root).unwrap();
                        let work = store.work_dir("race").unwrap();
                        let kept = fs::write(work.path().join("f"), b"x").is_ok()
                            && work.path().with_extension("lock").exists();
                        if !kept {
                            lost.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        assert_eq!(lost.into_inner(), 0, "work directories cleared as debris");
        // And what is dropped is gone.
        assert_eq!(fs::read_dir(root.join("tmp")).unwrap().count(), 0);
    }

    #[test]
    fn image_file_names_map_back_to_image_names() {
        for name in ["alpine", "library/python:3.12", "snap-0123abcd", "a.b_c-d"] {
            assert_eq!(file_to_name(&name_to_file(name)).as_deref(), Some(name));
        }
        for file in ["", ".hidden", "bad%", "bad%2", "bad%41", "sp ace"] {
            assert_eq!(file_to_name(file), None, "{file:?}");
        }
    }

    /// A layer of `contents` (one file), committed.
    fn layer(store: &Store, contents: &str) -> LayerRecord {
        let work = store.work_dir("test").unwrap();
        let tree = work.path().join("tree");
        fs::create_dir(&tree).unwrap();
        fs::write(tree.join("f"), contents).unwrap();
        store
            .commit_layer(
                &tree,
                &pack::PackOptions::default(),
                work.path(),
                &crate::Silent,
            )
            .unwrap()
    }

    fn image(store: &Store, name: &str, layers: &[&LayerRecord]) {
        let work = store.work_dir("test").unwrap();
        let record = ImageRecord {
            name: name.into(),
            layers: layers.iter().map(|l| l.digest.clone()).collect(),
            config: Default::default(),
            created_unix: now_unix(),
            origin: "test".into(),
            kind: Default::default(),
        };
        store.commit_image(&record, false, work.path()).unwrap();
    }

    #[test]
    fn discarding_an_image_removes_the_layers_only_it_has_and_no_sandbox_uses() {
        if which("mkfs.erofs").is_none() {
            eprintln!("skipped: this test needs mkfs.erofs");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let (shared, own, used) = (layer(&store, "a"), layer(&store, "b"), layer(&store, "c"));
        image(&store, "base", &[&shared]);
        image(&store, "snap-1", &[&shared, &own, &used]);
        // A sandbox running from it holds its layer files (see `use_layers`).
        let hex = hex_of(&used.digest).unwrap().to_string();
        let held = File::open(store.layer_file(&hex)).unwrap();
        rustix::fs::flock(&held, FlockOperation::LockShared).unwrap();

        let report = store.discard_image("snap-1").unwrap();
        assert!(!store.has_image("snap-1"));
        assert_eq!(store.image_names().unwrap(), ["base"]);
        assert_eq!(report.removed_layers, [own.digest.as_str()]);
        assert_eq!(report.freed_bytes, own.file_bytes);
        assert_eq!(report.in_use, [used.digest.as_str()]);
        assert!(!store.has_layer(&own.digest));
        assert!(store.has_layer(&shared.digest), "another image has it");
        assert!(store.has_layer(&used.digest), "a sandbox uses it");
        assert!(matches!(
            store.discard_image("snap-1"),
            Err(ImageError::NoSuchImage(_))
        ));
    }

    fn which(tool: &str) -> Option<PathBuf> {
        std::env::var_os("PATH").and_then(|path| {
            std::env::split_paths(&path)
                .map(|dir| dir.join(tool))
                .find(|p| p.is_file())
        })
    }
}
