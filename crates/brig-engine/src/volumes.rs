//! Volumes: per-tenant persistent filesystems that sessions mount read-write at
//! `/volume` (`POST /v1/sessions {"volume": NAME, "volume_size": SIZE}`), listed and
//! deleted through `/v1/volumes`.
//!
//! A volume is the directory `<data-dir>/volumes/<tenant>/<name>`, holding
//! `disk.ext4`, a sparse image file with an ext4 filesystem of the volume's capacity
//! (set when it is created), and `root`, where the daemon mounts it (see
//! [`brig_jail::disk`]). The capacity is what caps a session's writes: past it the
//! sandbox gets ENOSPC, and the host never gives the volume more than that. The
//! tenant's disk quota counts the capacity (reserved when the volume is made, like
//! a cloud disk), so a tenant's volumes can never take more than its quota.
//!
//! A volume can grow (`PATCH /v1/volumes/{name}`, see [`grow`]), never shrink: the
//! growth is checked against the quota under the lock session creates check theirs
//! under, then the image and its filesystem grow in place
//! ([`brig_jail::disk::grow`]), also while sessions use it if the host lets the
//! daemon grow a mounted filesystem (else 409 until they end). The capacity recorded
//! is what the filesystem holds: the new one once it has grown, never before.
//!
//! `<data-dir>/volumes`, each tenant's directory and each volume's are 0700: on the
//! host only root reaches a volume. Each session has its own leased host uid, so a
//! plain bind would leave one session's files foreign to the next: a volume is
//! bound through an idmapped mount (`BindMount::idmapped`) in which on-disk root is
//! the sandbox's user. Every session owns the volume's files, and whatever a session
//! writes lands on disk as root's. The mount is `nosuid,nodev`.
//!
//! Lifecycle: the first session that names a volume creates it (row first, then the
//! directory and the image; a create that fails afterwards removes a volume it
//! made). The daemon mounts it at first use and keeps it mounted until the volume is
//! deleted or the daemon stops (then only if no live session uses it: sessions
//! outlive the daemon, and a restarted daemon finds the mount in place). It lives
//! until `DELETE /v1/volumes/{name}`, which answers 409 while any live session (or a
//! create or a growth under way, see [`crate::sessions::Holds`]) uses it. Several
//! live sessions may use one volume at the same time: they share one filesystem and
//! see each other's writes at once, with no locking beyond what the programs in them
//! do.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::audit;
use crate::auth::Caller;
use crate::db::{now_rfc3339, VolumeRow};
use crate::fault::Error as ApiError;
use crate::sessions::Held;
use crate::sessions::Size;
use crate::state::{AppState, Shared};

/// Where a session sees its volume.
pub const MOUNT_PATH: &str = "/volume";
const MAX_NAME_LEN: usize = 64;
/// Prefix of a volume being deleted (renamed out of the way first); no valid name
/// starts with a dot.
const TRASH_PREFIX: &str = ".deleting-";
/// The capacity of a volume made without `volume_size`.
pub const DEFAULT_CAPACITY: u64 = 1 << 30;
/// The largest capacity a request may ask for (its tenant's quota applies too).
pub const MAX_CAPACITY: u64 = 1 << 40;
/// The image file and the mount point in a volume's directory.
const IMAGE: &str = "disk.ext4";
const MOUNT_POINT: &str = "root";

/// 1-64 characters of `[A-Za-z0-9_.-]`, not starting with a dot: a plain path
/// component (never `.`, `..` or hidden).
pub fn validate_name(name: &str) -> Result<(), ApiError> {
    let valid = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if valid {
        Ok(())
    } else {
        Err(ApiError::invalid(format!(
            "invalid volume name {name:?}: 1-{MAX_NAME_LEN} characters of letters, digits, '_', \
             '.' and '-', not starting with '.'"
        )))
    }
}

fn root(shared: &Shared) -> PathBuf {
    shared.data_dir.join("volumes")
}

fn tenant_dir(shared: &Shared, tenant: &str) -> PathBuf {
    root(shared).join(crate::filestore::tenant_dir_name(tenant))
}

/// The host directory of a tenant's volume (`name` must be valid): its image and
/// its mount point.
pub fn path(shared: &Shared, tenant: &str, name: &str) -> PathBuf {
    tenant_dir(shared, tenant).join(name)
}

/// Where the volume's filesystem is mounted on the host: what sessions bind.
pub fn mount_point(shared: &Shared, tenant: &str, name: &str) -> PathBuf {
    path(shared, tenant, name).join(MOUNT_POINT)
}

/// A request's `volume_size` in bytes: between [`brig_jail::disk::MIN_SIZE`] and
/// [`MAX_CAPACITY`].
pub fn requested_capacity(size: Option<&Size>) -> Result<Option<u64>, ApiError> {
    size.map(|size| capacity_in_range("volume_size", size))
        .transpose()
}

/// A capacity asked for in the request's `field`, in bytes: between
/// [`brig_jail::disk::MIN_SIZE`] and [`MAX_CAPACITY`].
fn capacity_in_range(field: &str, size: &Size) -> Result<u64, ApiError> {
    let bytes = size.bytes()?;
    let min = brig_jail::disk::MIN_SIZE;
    if !(min..=MAX_CAPACITY).contains(&bytes) {
        return Err(ApiError::invalid(format!(
            "{field} must be between {} MiB and {} TiB",
            min >> 20,
            MAX_CAPACITY >> 40
        )));
    }
    Ok(bytes)
}

/// The capacity a create would add to the tenant's disk use: that of the volume it
/// makes, or nothing for one that exists.
pub async fn new_capacity(
    shared: &Shared,
    tenant: &str,
    name: &str,
    requested: Option<u64>,
) -> Result<u64, ApiError> {
    let exists = shared.db.volume_exists_quick(tenant, name).await?;
    Ok(if exists {
        0
    } else {
        requested.unwrap_or(DEFAULT_CAPACITY)
    })
}

/// Makes sure the volume exists (row, directory, image) and is mounted; `true` if
/// this call created it. A `requested` capacity must match an existing volume's. A
/// directory found without a row (say after the database was lost) is adopted,
/// never discarded. The caller holds the volume (see
/// [`crate::sessions::Holds::claim`]), so it cannot be deleted meanwhile.
pub async fn ensure(
    shared: &Shared,
    tenant: &str,
    name: &str,
    requested: Option<u64>,
) -> Result<bool, ApiError> {
    validate_name(name)?;
    let capacity = requested.unwrap_or(DEFAULT_CAPACITY);
    let (new_row, stored) = shared
        .db
        .ensure_volume(tenant, name, now_rfc3339(), capacity)
        .await?;
    if !new_row {
        if stored == 0 {
            return Err(ApiError::conflict(format!(
                "volume {name} was made by an older brig, without a size cap; delete it and \
                 let a session make it again"
            )));
        }
        if requested.is_some_and(|r| r != stored) {
            return Err(ApiError::conflict(format!(
                "volume {name} has a capacity of {stored} bytes, fixed when it was made"
            )));
        }
    }
    let (parent, dir) = (tenant_dir(shared, tenant), path(shared, tenant, name));
    let made = tokio::task::spawn_blocking(move || make_disk(&parent, &dir, stored))
        .await
        .map_err(ApiError::internal)?;
    match made {
        Ok((new_disk, actual)) => {
            // An image adopted without its row: the file's size is the cap. (A known
            // volume's image may be longer than its capacity after a growth that
            // failed: the rest is unused.)
            if new_row && actual != stored {
                record_capacity(shared, tenant, name, actual).await?;
            }
            Ok(new_row && new_disk)
        }
        Err(e) => {
            if new_row {
                forget_row(shared, tenant, name).await;
            }
            Err(e)
        }
    }
}

/// Creates the volume's directory (0700, with private parents), its image of
/// `capacity` bytes unless there is one, and mounts it. Returns whether the image is
/// new, and its size.
fn make_disk(parent: &Path, dir: &Path, capacity: u64) -> Result<(bool, u64), ApiError> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let fail = |what: &Path, e: std::io::Error| {
        ApiError::internal(format_args!("volume {}: {e}", what.display()))
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(parent)
        .map_err(|e| fail(parent, e))?;
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| fail(dir, e))?,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            // Only the daemon writes in the tenant's directory; still, never use
            // anything but a real directory.
            if !std::fs::symlink_metadata(dir).is_ok_and(|meta| meta.is_dir()) {
                return Err(ApiError::internal(format_args!(
                    "{} exists and is not a directory",
                    dir.display()
                )));
            }
        }
        Err(e) => return Err(fail(dir, e)),
    }
    let (image, mount_point) = (dir.join(IMAGE), dir.join(MOUNT_POINT));
    match std::fs::DirBuilder::new().mode(0o755).create(&mount_point) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(fail(&mount_point, e)),
    }
    let (new, actual) = match std::fs::symlink_metadata(&image) {
        Ok(meta) if meta.is_file() => (false, meta.len()),
        Ok(_) => {
            return Err(ApiError::internal(format_args!(
                "{} is not a file",
                image.display()
            )))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            brig_jail::disk::format(&image, capacity, MAX_CAPACITY).map_err(|e| fail(&image, e))?;
            (true, capacity)
        }
        Err(e) => return Err(fail(&image, e)),
    };
    brig_jail::disk::mount(&image, &mount_point).map_err(|e| fail(&mount_point, e))?;
    if new {
        // mkfs makes one; an empty volume should look empty (fsck makes it again
        // if it ever needs it).
        let _ = std::fs::remove_dir(mount_point.join("lost+found"));
    }
    Ok((new, actual))
}

/// The recorded capacity of a tenant's volume; `None` if there is no such volume.
async fn capacity_of(shared: &Shared, tenant: &str, name: &str) -> Result<Option<u64>, ApiError> {
    shared.db.volume_capacity(tenant, name).await
}

async fn record_capacity(
    shared: &Shared,
    tenant: &str,
    name: &str,
    capacity: u64,
) -> Result<(), ApiError> {
    shared.db.set_volume_capacity(tenant, name, capacity).await
}

/// Grows a tenant's volume to `capacity` bytes (within [`capacity_in_range`]),
/// which its disk quota must have room for (the capacity it has already is a
/// success that changes nothing); also while sessions use it, where the
/// host lets the daemon grow a mounted filesystem.
async fn grow(state: &AppState, tenant: &str, name: &str, capacity: u64) -> Result<(), ApiError> {
    let held = Held::Volume {
        tenant: tenant.to_string(),
        name: name.to_string(),
    };
    // The lock session creates check their quota under, held until the capacity is
    // recorded: no create or other growth can count the same room meanwhile. The
    // capacity is recorded only once the filesystem has it, so the lock is held
    // across the growth (usually a fraction of a second; a create that uses a volume
    // holds it across making or mounting it and starting its sandbox too).
    let _admission = state.sessions().admit().await;
    // Meanwhile a delete answers 409, and a daemon stopping leaves the volume alone.
    let _claim = state.holds.claim(vec![held.clone()]).await;
    let Some(stored) = capacity_of(state, tenant, name).await? else {
        return Err(ApiError::not_found(format!("no volume {name}")));
    };
    if stored == 0 {
        return Err(ApiError::conflict(format!(
            "volume {name} was made by an older brig, without a size cap; delete it and \
             let a session make it again"
        )));
    }
    // Asking for the capacity it has is done already: a client retrying a growth
    // whose answer it never saw (or that failed once the filesystem had grown) gets
    // its success, not an error.
    if capacity == stored {
        return Ok(());
    }
    if capacity < stored {
        return Err(ApiError::invalid(format!(
            "volume {name} has a capacity of {stored} bytes and volumes only grow: ask for \
             that much or more"
        )));
    }
    let quotas = state.auth.quotas(tenant).await?;
    let used = state
        .sessions()
        .usage(tenant)
        .disk_bytes
        .saturating_add(state.db.stored_bytes(tenant).await?);
    let wanted = used.saturating_add(capacity - stored);
    if wanted > quotas.max_disk_bytes {
        return Err(ApiError::quota(format!(
            "tenant {tenant} would use {wanted} of its {} bytes of disk (GET \
             /v1/tenants/{tenant} shows what counts)",
            quotas.max_disk_bytes
        )));
    }
    let users = crate::sessions::users(state, &held);
    if !users.is_empty() && !brig_jail::disk::can_grow_online() {
        return Err(ApiError::conflict(format!(
            "volume {name} is in use by sessions {users:?}, and this host does not let the \
             daemon grow a mounted filesystem (it lacks CAP_SYS_RESOURCE); delete them first"
        )));
    }
    let (image, mount_point) = (
        path(state, tenant, name).join(IMAGE),
        self::mount_point(state, tenant, name),
    );
    let grown =
        tokio::task::spawn_blocking(move || brig_jail::disk::grow(&image, &mount_point, capacity))
            .await
            .map_err(ApiError::internal)?;
    let (now, result) = match grown {
        Ok(()) => (capacity, Ok(())),
        Err(brig_jail::disk::GrowError::InUse) => (
            stored,
            Err(ApiError::conflict(format!(
                "volume {name} is still mounted by a sandbox that is ending; try again shortly"
            ))),
        ),
        // Volumes made before 4 KiB blocks were the rule can grow only so far.
        Err(brig_jail::disk::GrowError::TooLarge { reason }) => (
            stored,
            Err(ApiError::invalid(format!(
                "volume {name} cannot grow to {capacity} bytes, its filesystem says: \
                 {reason}; it keeps its {stored} bytes (ask for less)"
            ))),
        ),
        // What the filesystem holds now: as before, or more if it grew part of the
        // way (within what the quota allowed).
        Err(brig_jail::disk::GrowError::Failed { error, size }) => (
            size.map_or(stored, |size| size.clamp(stored, capacity)),
            Err(ApiError::internal(format_args!(
                "grow volume {tenant}/{name} to {capacity} bytes: {error}"
            ))),
        ),
    };
    if now != stored {
        record_capacity(state, tenant, name, now).await?;
    }
    result
}

async fn forget_row(shared: &Shared, tenant: &str, name: &str) {
    let _ = shared.db.delete_volume(tenant, name).await;
}

/// Removes a volume that a failed session create made, unless someone else uses it
/// by now. The caller still holds its own claim (`own_claims`, usually 1).
pub async fn discard_new(shared: &Shared, tenant: &str, name: &str, own_claims: usize) {
    let held = Held::Volume {
        tenant: tenant.to_string(),
        name: name.to_string(),
    };
    let _lock = shared.holds.lock().await;
    if !crate::sessions::users(shared, &held).is_empty() || shared.holds.pending(&held) > own_claims
    {
        return;
    }
    match remove(shared, tenant, name).await {
        Ok(Some(trash)) => purge(trash).await,
        Ok(None) => {}
        Err(e) => tracing::warn!(
            tenant,
            volume = name,
            "cannot remove a new volume: {}",
            e.message
        ),
    }
}

/// Renames the directory out of the way and deletes the row (call under the holds
/// lock); `None` if there was no row, else where the files now are, for [`purge`]
/// (after the lock: a large volume takes a while).
async fn remove(shared: &Shared, tenant: &str, name: &str) -> Result<Option<PathBuf>, ApiError> {
    let dir = path(shared, tenant, name);
    let trash =
        tenant_dir(shared, tenant).join(format!("{TRASH_PREFIX}{}", crate::auth::random_hex(8)));
    let known = shared.db.volume_exists(tenant, name).await?;
    if !known {
        return Ok(None);
    }
    // Nobody uses it (the caller checked under the holds lock): a mount left would
    // keep the files from being removed.
    let mount_point = dir.join(MOUNT_POINT);
    tokio::task::spawn_blocking(move || brig_jail::disk::unmount(&mount_point))
        .await
        .map_err(ApiError::internal)?
        .map_err(|e| ApiError::internal(format_args!("unmount {}: {e}", dir.display())))?;
    // Renamed first: a daemon that dies before the row is gone leaves the volume
    // listed but empty (delete it again), never a directory no row accounts for.
    match tokio::fs::rename(&dir, &trash).await {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(ApiError::internal(format_args!(
                "move {} away: {e}",
                dir.display()
            )))
        }
    }
    forget_row(shared, tenant, name).await;
    Ok(Some(trash))
}

/// Removes a deleted volume's files (renamed by [`remove`]; nothing if it had none).
async fn purge(trash: PathBuf) {
    // std's remove_dir_all never follows symlinks (it works on descriptors).
    let path = trash.clone();
    match tokio::task::spawn_blocking(move || std::fs::remove_dir_all(&path)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => {}
        _ => tracing::warn!(
            path = %trash.display(),
            "a deleted volume's files were not all removed; the next start removes the rest"
        ),
    }
}

/// The capacity of a tenant's volumes (part of its disk quota).
pub async fn usage(shared: &Shared, tenant: &str) -> Result<u64, ApiError> {
    shared.db.volume_capacity_total(tenant).await
}

/// A volume's bytes in use: measured if it is mounted, else `stored` (measured when
/// it was last unmounted).
fn current_size(mount_point: &Path, stored: u64) -> u64 {
    match brig_jail::disk::is_mount_root(mount_point) {
        Ok(true) => brig_jail::disk::used(mount_point).unwrap_or(0),
        _ => stored,
    }
}

/// At shutdown: unmounts the volumes no live session uses (sessions outlive the
/// daemon; the next daemon finds their volumes mounted and goes on with them).
pub async fn unmount_unused(shared: &Shared) {
    unmount_idle(shared, |_| true).await;
}

/// Every `--volume-idle-unmount`: unmounts the volumes no session was using at this
/// round nor at the one before (a session that used one only in between is not
/// seen: the volume is mounted again at its next use). A mounted volume holds a loop device, a mount and a journal thread of
/// the host's, which a tenant could otherwise keep for each of its volumes; the next
/// session that uses one mounts it again.
pub fn spawn_idle_unmount(state: &crate::state::AppState) {
    let interval = std::time::Duration::from_millis(state.args.volume_idle_unmount_ms);
    let idle_before = Arc::new(Mutex::new(HashSet::new()));
    crate::state::spawn_periodic(state, interval, move |state| {
        let idle_before = idle_before.clone();
        async move {
            let before =
                std::mem::take(&mut *idle_before.lock().unwrap_or_else(|e| e.into_inner()));
            let idle_now = unmount_idle(&state, |volume| before.contains(volume)).await;
            *idle_before.lock().unwrap_or_else(|e| e.into_inner()) = idle_now;
        }
    });
}

/// Unmounts each volume no live session uses (nor waits for) that `chosen` picks,
/// and returns the unused ones it left. Each is checked and unmounted under the
/// holds' lock, taken per volume, so session creates wait for one at most.
async fn unmount_idle(
    shared: &Shared,
    chosen: impl Fn(&(String, String)) -> bool,
) -> HashSet<(String, String)> {
    let rows = shared.db.all_volumes().await.unwrap_or_default();
    let mut left = HashSet::new();
    for volume in rows {
        let _lock = shared.holds.lock().await;
        let (tenant, name) = volume.clone();
        let held = Held::Volume {
            tenant: tenant.clone(),
            name: name.clone(),
        };
        if !crate::sessions::users(shared, &held).is_empty() || shared.holds.pending(&held) > 0 {
            continue;
        }
        if !chosen(&volume) {
            left.insert(volume);
            continue;
        }
        let mount_point = mount_point(shared, &tenant, &name);
        let done = tokio::task::spawn_blocking(move || {
            let used = brig_jail::disk::is_mount_root(&mount_point)
                .unwrap_or(false)
                .then(|| brig_jail::disk::used(&mount_point).ok())
                .flatten();
            brig_jail::disk::unmount(&mount_point).map(|()| used)
        })
        .await;
        match done {
            Ok(Ok(Some(used))) => {
                // Listed as this until it is mounted again.
                let _ = shared.db.record_volume_size(&tenant, &name, used).await;
            }
            Ok(Ok(None)) => {}
            other => tracing::warn!(tenant, volume = name, "cannot unmount a volume: {other:?}"),
        }
    }
    left
}

/// At startup: removes what deletions interrupted by a crash left (renamed
/// directories whose contents were not all removed).
pub async fn sweep(shared: &Shared) {
    let root = root(shared);
    let _ = tokio::task::spawn_blocking(move || {
        let Ok(tenants) = std::fs::read_dir(&root) else {
            return;
        };
        for tenant in tenants.flatten() {
            let Ok(entries) = std::fs::read_dir(tenant.path()) else {
                continue;
            };
            for entry in entries.flatten() {
                if entry.file_name().to_string_lossy().starts_with(TRASH_PREFIX) {
                    if let Err(e) = std::fs::remove_dir_all(entry.path()) {
                        tracing::warn!(path = %entry.path().display(), "cannot remove a deleted volume: {e}");
                    }
                }
            }
        }
    })
    .await;
}

// ---------------------------------------------------------------------------------
// Verbs (`/v1/volumes`)

/// A volume as listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeInfo {
    pub name: String,
    /// Bytes in use in it: live while the daemon has it mounted, else as it was
    /// when last unmounted.
    pub size_bytes: u64,
    /// The most it can hold; what the tenant's disk quota counts.
    pub capacity_bytes: u64,
    pub created_at: String,
    /// Live sessions that mount it now.
    pub sessions: Vec<String>,
}

/// The caller's tenant's volumes.
pub async fn list(state: &AppState, caller: &Caller) -> Result<Vec<VolumeInfo>, ApiError> {
    infos(state, &caller.tenant, None).await
}

/// The tenant's volumes as listed, by name; only the one called `only` if given.
async fn infos(
    state: &AppState,
    tenant: &str,
    only: Option<&str>,
) -> Result<Vec<VolumeInfo>, ApiError> {
    let rows = state.db.volumes(tenant, only).await?;
    let mounts: Vec<(PathBuf, u64)> = rows
        .iter()
        .map(|row| (mount_point(state, tenant, &row.name), row.size_bytes))
        .collect();
    let sizes = tokio::task::spawn_blocking(move || {
        mounts
            .iter()
            .map(|(mount_point, stored)| current_size(mount_point, *stored))
            .collect::<Vec<u64>>()
    })
    .await
    .map_err(ApiError::internal)?;
    Ok(rows
        .into_iter()
        .zip(sizes)
        .map(|(row, size_bytes)| {
            let VolumeRow {
                name,
                capacity_bytes,
                created_at,
                ..
            } = row;
            let held = Held::Volume {
                tenant: tenant.to_string(),
                name: name.clone(),
            };
            VolumeInfo {
                sessions: crate::sessions::users(state, &held),
                name,
                size_bytes,
                capacity_bytes,
                created_at,
            }
        })
        .collect())
}

/// Grows the caller's volume `name` to `capacity` (see [`grow`]) and returns it as
/// listed. Audited as `volume.grow`.
pub async fn update(
    state: &AppState,
    caller: &Caller,
    name: &str,
    capacity: &Size,
) -> Result<VolumeInfo, ApiError> {
    let mut bytes = None;
    let result = async {
        validate_name(name)?;
        let wanted = capacity_in_range("capacity", capacity)?;
        bytes = Some(wanted);
        grow(state, &caller.tenant, name, wanted).await
    }
    .await;
    audit::record(
        state,
        caller,
        None,
        "volume.grow",
        serde_json::json!({"volume": name, "capacity_bytes": bytes}),
        audit::outcome(&result),
    )
    .await;
    result?;
    infos(state, &caller.tenant, Some(name))
        .await?
        .pop()
        .ok_or_else(|| ApiError::not_found(format!("no volume {name}")))
}

/// Deletes the caller's volume `name` and its files: 409 while a session uses it.
/// Audited as `volume.delete`.
pub async fn delete(state: &AppState, caller: &Caller, name: &str) -> Result<(), ApiError> {
    let result = async {
        validate_name(name)?;
        let held = Held::Volume {
            tenant: caller.tenant.clone(),
            name: name.to_string(),
        };
        // Held while checking and removing: no create can claim it in between.
        let lock = state.holds.lock().await;
        let users = crate::sessions::users(state, &held);
        if !users.is_empty() || state.holds.pending(&held) > 0 {
            return Err(ApiError::conflict(format!(
                "volume {name} is in use by sessions {users:?}; delete them first"
            )));
        }
        let trash = remove(state, &caller.tenant, name).await?;
        drop(lock);
        match trash {
            Some(trash) => {
                purge(trash).await;
                Ok(())
            }
            None => Err(ApiError::not_found(format!("no volume {name}"))),
        }
    }
    .await;
    let outcome = audit::outcome(&result);
    audit::record(
        state,
        caller,
        None,
        "volume.delete",
        serde_json::json!({"volume": name}),
        outcome,
    )
    .await;
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for good in ["data", "a", "A-b_c.d", "x..y", &"n".repeat(64)] {
            assert!(validate_name(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            ".",
            "..",
            ".hidden",
            "a/b",
            "../x",
            "a\0b",
            "a b",
            "é",
            &"n".repeat(65),
        ] {
            assert!(validate_name(bad).is_err(), "{bad:?}");
        }
    }
}
