//! Volumes: per-tenant persistent directories that sessions mount read-write at
//! `/volume` (`POST /v1/sessions {"volume": NAME}`), listed and deleted through
//! `/v1/volumes`.
//!
//! A volume is the directory `<data-dir>/volumes/<tenant>/<name>`, owned by root
//! (mode 0755), with a row in the `volumes` table. `<data-dir>/volumes` and each
//! tenant's directory are 0700: on the host only root reaches a volume. Each session
//! has its own leased host uid, so a plain bind would leave one session's files
//! foreign to the next: a volume is bound through an idmapped mount
//! (`BindMount::idmapped`) in which on-disk root is the sandbox's user. Every session
//! owns the volume's files, and whatever a session writes lands on disk as root's.
//! The mount is `nosuid,nodev`.
//!
//! Lifecycle: the first session that names a volume creates it (row first, then the
//! directory; a create that fails afterwards removes a volume it made). It lives until
//! `DELETE /v1/volumes/{name}`, which answers 409 while any live session (or a create
//! under way, see [`crate::sessions::Holds`]) uses it. Several live sessions may use
//! one volume at the same time: they see each other's writes at once, with no locking
//! beyond what the programs in them do.
//!
//! Size: measured by a walk that never follows symlinks (allocated bytes, hard links
//! once) when the last session using the volume ends, stored in the row and counted
//! in the tenant's disk quota. It is not measured while sessions write to it: a
//! session's writes to its volume are not capped, and a tenant found over its quota
//! afterwards cannot create sessions or upload files until it frees space.

use std::collections::HashSet;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::audit;
use crate::auth::Caller;
use crate::db::now_rfc3339;
use crate::error::{ApiError, ApiJson, ApiPath};
use crate::sessions::Held;
use crate::state::{AppState, Shared};

/// Where a session sees its volume.
pub const MOUNT_PATH: &str = "/volume";
const MAX_NAME_LEN: usize = 64;
/// Prefix of a volume being deleted (renamed out of the way first); no valid name
/// starts with a dot.
const TRASH_PREFIX: &str = ".deleting-";
/// Directory levels the size walk descends (one descriptor each).
const MAX_DEPTH: usize = 1024;

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

/// The host directory of a tenant's volume (`name` must be valid).
pub fn path(shared: &Shared, tenant: &str, name: &str) -> PathBuf {
    tenant_dir(shared, tenant).join(name)
}

/// Makes sure the volume exists (row and directory); `true` if this call created
/// both (a directory found without a row, say after the database was lost, is
/// adopted, never discarded). The caller holds the volume (see
/// [`crate::sessions::Holds::claim`]), so it cannot be deleted meanwhile.
pub async fn ensure(shared: &Shared, tenant: &str, name: &str) -> Result<bool, ApiError> {
    validate_name(name)?;
    let row = (tenant.to_string(), name.to_string(), now_rfc3339());
    let new_row = shared
        .db
        .call(move |conn| {
            conn.execute(
                "INSERT OR IGNORE INTO volumes (tenant, name, created_at, size_bytes)
                 VALUES (?1, ?2, ?3, 0)",
                rusqlite::params![row.0, row.1, row.2],
            )
        })
        .await?
        == 1;
    let (parent, dir) = (tenant_dir(shared, tenant), path(shared, tenant, name));
    let created = tokio::task::spawn_blocking(move || make_dir(&parent, &dir))
        .await
        .map_err(ApiError::internal)?;
    match created {
        Ok(new_dir) => Ok(new_row && new_dir),
        Err(e) => {
            if new_row {
                forget_row(shared, tenant, name).await;
            }
            Err(e)
        }
    }
}

/// Creates the volume directory (0755, root's) and its private parents (0700);
/// `false` if it was there.
fn make_dir(parent: &Path, dir: &Path) -> Result<bool, ApiError> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let fail = |what: &Path, e: std::io::Error| {
        ApiError::internal(format_args!("create {}: {e}", what.display()))
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(parent)
        .map_err(|e| fail(parent, e))?;
    match std::fs::DirBuilder::new().mode(0o755).create(dir) {
        Ok(()) => std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))
            .map(|()| true)
            .map_err(|e| fail(dir, e)),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            // Only the daemon writes in the tenant's directory; still, never bind
            // anything but a real directory.
            match std::fs::symlink_metadata(dir) {
                Ok(meta) if meta.is_dir() => Ok(false),
                _ => Err(ApiError::internal(format_args!(
                    "{} exists and is not a directory",
                    dir.display()
                ))),
            }
        }
        Err(e) => Err(fail(dir, e)),
    }
}

async fn forget_row(shared: &Shared, tenant: &str, name: &str) {
    let (tenant, name) = (tenant.to_string(), name.to_string());
    let _ = shared
        .db
        .call(move |conn| {
            conn.execute(
                "DELETE FROM volumes WHERE tenant = ?1 AND name = ?2",
                rusqlite::params![tenant, name],
            )
        })
        .await;
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
    let (t, n) = (tenant.to_string(), name.to_string());
    let known = shared
        .db
        .call(move |conn| {
            conn.query_row(
                "SELECT COUNT(*) FROM volumes WHERE tenant = ?1 AND name = ?2",
                rusqlite::params![t, n],
                |row| row.get::<_, i64>(0),
            )
        })
        .await?
        > 0;
    if !known {
        return Ok(None);
    }
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

/// Allocated bytes under `dir` (the directory itself included): a walk on
/// descriptors that never follows a symlink (the tree is written by sandboxes), counts
/// a hard-linked file once, and stops descending after [`MAX_DEPTH`] levels.
/// Entries that vanish during the walk are skipped. Blocking.
pub fn measure(dir: &Path) -> std::io::Result<u64> {
    use rustix::fs::{fstat, openat, statat, AtFlags, Dir, FileType, Mode, OFlags, CWD};
    use rustix::io::Errno;
    use std::sync::Arc;
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let mut total = 0u64;
    let mut linked = HashSet::new();
    // Directories still to list, by parent descriptor and name: a directory is
    // opened when its turn comes, so (depth first) the descriptors open at once are
    // those of one path from the top.
    let mut todo: Vec<(Arc<OwnedFd>, std::ffi::CString, usize)> = Vec::new();
    let top = openat(CWD, dir, flags, Mode::empty())?;
    let mut next = Some((top, 0usize));
    loop {
        let (fd, depth) = match next.take() {
            Some(first) => first,
            None => {
                let Some((parent, name, depth)) = todo.pop() else {
                    break;
                };
                match openat(&*parent, &name, flags, Mode::empty()) {
                    Ok(fd) => (fd, depth),
                    // Removed, or replaced by a symlink or a file, since it was listed.
                    Err(Errno::NOENT | Errno::LOOP | Errno::NOTDIR) => continue,
                    Err(e) => return Err(e.into()),
                }
            }
        };
        total = total.saturating_add(fstat(&fd)?.st_blocks as u64 * 512);
        let mut subdirs = Vec::new();
        for entry in Dir::read_from(&fd)? {
            let entry = entry?;
            let name = entry.file_name();
            if name == c"." || name == c".." {
                continue;
            }
            let stat = match statat(&fd, name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(stat) => stat,
                Err(Errno::NOENT) => continue,
                Err(e) => return Err(e.into()),
            };
            if FileType::from_raw_mode(stat.st_mode) == FileType::Directory {
                if depth < MAX_DEPTH {
                    subdirs.push(name.to_owned());
                }
                continue;
            }
            if stat.st_nlink > 1 && !linked.insert((stat.st_dev, stat.st_ino)) {
                continue;
            }
            total = total.saturating_add(stat.st_blocks as u64 * 512);
        }
        if !subdirs.is_empty() {
            let parent = Arc::new(fd);
            todo.extend(
                subdirs
                    .into_iter()
                    .map(|name| (parent.clone(), name, depth + 1)),
            );
        }
    }
    Ok(total)
}

/// Measures a volume no live session uses any more and stores its size.
pub async fn settle(shared: &Shared, tenant: &str, name: &str) {
    let held = Held::Volume {
        tenant: tenant.to_string(),
        name: name.to_string(),
    };
    if !crate::sessions::users(shared, &held).is_empty() {
        return;
    }
    let dir = path(shared, tenant, name);
    let size = match tokio::task::spawn_blocking(move || measure(&dir)).await {
        Ok(Ok(size)) => size,
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => return,
        Ok(Err(e)) => {
            tracing::warn!(tenant, volume = name, "cannot measure a volume: {e}");
            return;
        }
        Err(e) => {
            tracing::warn!(tenant, volume = name, "volume measure task: {e}");
            return;
        }
    };
    let (tenant, name) = (tenant.to_string(), name.to_string());
    let saved = shared
        .db
        .call(move |conn| {
            conn.execute(
                "UPDATE volumes SET size_bytes = ?3, measured_at = ?4 WHERE tenant = ?1 AND name = ?2",
                rusqlite::params![tenant, name, crate::db::to_sql_int(size), now_rfc3339()],
            )
        })
        .await;
    if let Err(e) = saved {
        tracing::warn!("cannot store a volume's size: {}", e.message);
    }
}

/// The measured bytes of a tenant's volumes (part of its disk quota).
pub async fn usage(shared: &Shared, tenant: &str) -> Result<u64, ApiError> {
    let tenant = tenant.to_string();
    shared
        .db
        .call(move |conn| {
            conn.query_row(
                "SELECT COALESCE(SUM(size_bytes), 0) FROM volumes WHERE tenant = ?1",
                [tenant],
                |row| row.get::<_, i64>(0),
            )
        })
        .await
        .map(crate::db::from_sql_int)
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
// HTTP

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct VolumeInfo {
    pub name: String,
    /// Allocated bytes, as measured when the last session using it ended (not
    /// updated while sessions write to it).
    pub size_bytes: u64,
    pub created_at: String,
    /// Live sessions that mount it now.
    pub sessions: Vec<String>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct VolumeList {
    pub volumes: Vec<VolumeInfo>,
}

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_volumes))
        .routes(routes!(delete_volume))
}

/// The tenant's volumes.
#[utoipa::path(get, path = "/v1/volumes", tag = "volumes",
    responses((status = 200, body = VolumeList), (status = 401, body = crate::error::ErrorBody)),
    security(("bearer" = []), ("api_key" = [])))]
async fn list_volumes(
    State(state): State<AppState>,
    caller: Caller,
) -> Result<ApiJson<VolumeList>, ApiError> {
    let tenant = caller.tenant.clone();
    let rows = state
        .db
        .call(move |conn| {
            let mut stmt = conn.prepare(
                "SELECT name, size_bytes, created_at FROM volumes WHERE tenant = ?1 ORDER BY name",
            )?;
            let rows = stmt
                .query_map([tenant], |row| {
                    Ok((
                        row.get::<_, String>(0)?,
                        row.get::<_, i64>(1)?,
                        row.get::<_, String>(2)?,
                    ))
                })?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(rows)
        })
        .await?;
    let volumes = rows
        .into_iter()
        .map(|(name, size, created_at)| {
            let held = Held::Volume {
                tenant: caller.tenant.clone(),
                name: name.clone(),
            };
            VolumeInfo {
                sessions: crate::sessions::users(&state, &held),
                name,
                size_bytes: crate::db::from_sql_int(size),
                created_at,
            }
        })
        .collect();
    Ok(ApiJson(VolumeList { volumes }))
}

/// Delete a volume and its files: 409 while a session uses it.
#[utoipa::path(delete, path = "/v1/volumes/{name}", tag = "volumes",
    params(("name" = String, Path)),
    responses((status = 204, description = "Deleted"), (status = 401, body = crate::error::ErrorBody),
              (status = 404, body = crate::error::ErrorBody), (status = 409, body = crate::error::ErrorBody),
              (status = 422, body = crate::error::ErrorBody)),
    security(("bearer" = []), ("api_key" = [])))]
async fn delete_volume(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(name): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    let result = async {
        validate_name(&name)?;
        let held = Held::Volume {
            tenant: caller.tenant.clone(),
            name: name.clone(),
        };
        // Held while checking and removing: no create can claim it in between.
        let lock = state.holds.lock().await;
        let users = crate::sessions::users(&state, &held);
        if !users.is_empty() || state.holds.pending(&held) > 0 {
            return Err(ApiError::conflict(format!(
                "volume {name} is in use by sessions {users:?}; delete them first"
            )));
        }
        let trash = remove(&state, &caller.tenant, &name).await?;
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
        &state,
        &caller,
        None,
        "volume.delete",
        serde_json::json!({"volume": name}),
        outcome,
    )
    .await;
    result.map(|()| StatusCode::NO_CONTENT)
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

    #[test]
    fn measure_counts_files_once_and_never_follows_symlinks() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("big"), vec![1u8; 1 << 20]).unwrap();
        let vol = tempfile::tempdir().unwrap();
        let empty = measure(vol.path()).unwrap();
        std::fs::create_dir_all(vol.path().join("a/b")).unwrap();
        std::fs::write(vol.path().join("a/b/f"), vec![1u8; 100_000]).unwrap();
        std::fs::hard_link(vol.path().join("a/b/f"), vol.path().join("a/f2")).unwrap();
        std::os::unix::fs::symlink(outside.path(), vol.path().join("dir-link")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("big"), vol.path().join("file-link"))
            .unwrap();
        let size = measure(vol.path()).unwrap();
        assert!(size >= empty + 100_000, "{size}");
        assert!(
            size < empty + 100_000 + (1 << 19),
            "{size}: a link was followed"
        );
        // A symlink as the volume itself is refused, not followed.
        let link = outside.path().join("vol-link");
        std::os::unix::fs::symlink(vol.path(), &link).unwrap();
        assert!(measure(&link).is_err());
    }
}
