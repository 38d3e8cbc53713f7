//! Uploaded files (`/v1/files`, onyx-compatible) and their expiry.
//!
//! A file is stored at `<data-dir>/files/<tenant>/<file_id>`: received into a
//! temporary name in the same directory, never held in memory, and renamed into place
//! when complete, so a reader never sees a partial file and a failed or interrupted
//! upload leaves nothing behind. The row in the `files` table is written after the
//! rename; a blob without a row (a crash in between) is removed by the startup sweep.
//!
//! Files expire `--file-ttl` after upload: an expired file answers 404 at once, and a
//! background task (at startup, then every minute) deletes rows and blobs.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use crate::audit;
use crate::auth::{validate_tenant_name, Caller};
use crate::db::{now_rfc3339, rfc3339_after, FileRow};
use crate::fault::Error as ApiError;
use crate::state::{AppState, Shared};

/// How often expired files are deleted.
pub const EXPIRY_INTERVAL: Duration = Duration::from_secs(60);
/// Read size when copying a file in.
const CHUNK: usize = 64 << 10;
const TMP_PREFIX: &str = ".tmp-";
const MAX_FILENAME_BYTES: usize = 255;

/// A stored file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FileMeta {
    pub file_id: String,
    pub tenant: String,
    pub filename: String,
    pub size_bytes: u64,
    /// Lowercase hex.
    pub sha256: String,
    pub created_at: String,
    pub expires_at: String,
}

impl From<FileRow> for FileMeta {
    fn from(row: FileRow) -> FileMeta {
        FileMeta {
            file_id: row.id,
            tenant: row.tenant,
            filename: row.filename,
            size_bytes: row.size_bytes,
            sha256: row.sha256,
            created_at: row.created_at,
            expires_at: row.expires_at,
        }
    }
}

/// 32 lowercase hex characters (128 random bits).
pub fn new_file_id() -> String {
    let mut bytes = [0u8; 16];
    rand::fill(&mut bytes[..]);
    hex::encode(bytes)
}

fn is_file_id(text: &str) -> bool {
    text.len() == 32 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The directory name of a tenant's files: the tenant name itself (validated names
/// are safe path components); anything else is hex-encoded behind a `~`, which no
/// valid name contains.
pub(crate) fn tenant_dir_name(tenant: &str) -> String {
    if validate_tenant_name(tenant).is_ok() {
        tenant.to_string()
    } else {
        format!("~{}", hex::encode(tenant))
    }
}

fn tenant_dir(state: &Shared, tenant: &str) -> PathBuf {
    state.files_dir().join(tenant_dir_name(tenant))
}

/// Keeps only the last path component, drops control characters and caps the length;
/// `file` if nothing is left.
pub fn sanitize_filename(name: Option<&str>) -> String {
    let base = name.unwrap_or("").rsplit(['/', '\\']).next().unwrap_or("");
    let mut clean: String = base.chars().filter(|c| !c.is_control()).collect();
    clean = clean.trim().to_string();
    if clean.len() > MAX_FILENAME_BYTES {
        let mut end = MAX_FILENAME_BYTES;
        while !clean.is_char_boundary(end) {
            end -= 1;
        }
        clean.truncate(end);
    }
    if clean.is_empty() || clean == "." || clean == ".." {
        "file".to_string()
    } else {
        clean
    }
}

/// Removes a temporary file when dropped, unless disarmed: an upload that fails or
/// whose client goes away (the handler's future is dropped) leaves nothing behind.
struct TempFile {
    path: Option<PathBuf>,
}

impl TempFile {
    fn disarm(&mut self) {
        self.path = None;
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if let Some(path) = self.path.take() {
            if let Err(e) = std::fs::remove_file(&path) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(path = %path.display(), error = %e, "cannot remove a temporary file");
                }
            }
        }
    }
}

async fn create_tenant_dir(dir: &Path) -> Result<(), ApiError> {
    tokio::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .await
        .map_err(|e| ApiError::internal(format_args!("create {}: {e}", dir.display())))
}

/// What a failed read of an upload's body is answered with: the engine error a
/// front end wrapped in it (`io::Error::other(error)`: its own limit, a body it
/// cannot parse), else a bad request.
fn read_error(err: std::io::Error) -> ApiError {
    match err
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<ApiError>())
    {
        Some(error) => error.clone(),
        None => ApiError::bad_request(format!("unreadable upload: {err}")),
    }
}

/// Streams `body` into the tenant's store.
async fn receive(
    state: &Shared,
    tenant: &str,
    filename: String,
    body: &mut (dyn AsyncRead + Unpin + Send),
) -> Result<FileMeta, ApiError> {
    let max_size = state.args.max_file_size_bytes;
    let (room, max_disk) = disk_room(state, tenant).await?;
    let dir = tenant_dir(state, tenant);
    create_tenant_dir(&dir).await?;
    let id = new_file_id();
    let tmp = dir.join(format!("{TMP_PREFIX}{id}"));
    let mut guard = TempFile {
        path: Some(tmp.clone()),
    };
    let mut file = tokio::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .await?;
    let mut hasher = Sha256::new();
    let mut size: u64 = 0;
    let mut over_quota = false;
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = match body.read(&mut buf).await {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(read_error(e)),
        };
        let chunk = &buf[..n];
        size += n as u64;
        if size > max_size {
            return Err(ApiError::too_large(format!(
                "file is over the limit of {max_size} bytes (--max-file-size)"
            )));
        }
        // Past the quota the rest is read and dropped (no more than the size
        // limit): answered at once, a client still sending would see its
        // connection cut (EPIPE), not the 429.
        over_quota |= crate::db::charged_file_bytes(size) > room;
        if over_quota {
            continue;
        }
        hasher.update(chunk);
        file.write_all(chunk).await?;
    }
    if over_quota {
        return Err(ApiError::quota(format!(
            "tenant {tenant} would use more than its {max_disk} bytes of disk with this \
             file (GET /v1/tenants/{tenant} shows what counts)"
        )));
    }
    file.sync_data().await?;
    drop(file);
    let path = dir.join(&id);
    tokio::fs::rename(&tmp, &path).await?;
    guard.disarm();
    let row = FileRow {
        id,
        tenant: tenant.to_string(),
        filename,
        size_bytes: size,
        sha256: hex::encode(hasher.finalize()),
        created_at: now_rfc3339(),
        expires_at: rfc3339_after(Duration::from_millis(state.args.file_ttl_ms)),
    };
    if let Err(e) = record_within_quota(state, row.clone(), max_disk).await {
        let _ = tokio::fs::remove_file(&path).await;
        return Err(e);
    }
    Ok(row.into())
}

/// Stores an upload in the caller's tenant's store: `body`'s bytes (up to
/// `--max-file-size`, within the tenant's disk quota), named `filename` as the
/// client gave it (sanitized here). Written to disk as it is read, never held in
/// memory; a failure, or the caller dropping the future, leaves nothing behind. A
/// read error is answered as [`read_error`] says. Audited as `file.upload` when
/// stored or failed (not when refused).
pub async fn upload(
    state: &Shared,
    caller: &Caller,
    filename: Option<&str>,
    body: &mut (dyn AsyncRead + Unpin + Send),
) -> Result<FileMeta, ApiError> {
    let filename = sanitize_filename(filename);
    let meta = match receive(state, &caller.tenant, filename, body).await {
        Ok(meta) => meta,
        Err(e) => {
            if e.code.is_failure() {
                audit::record(
                    state,
                    caller,
                    None,
                    "file.upload",
                    serde_json::json!({"error": e.code.as_str()}),
                    "error",
                )
                .await;
            }
            return Err(e);
        }
    };
    audit::record(
        state,
        caller,
        None,
        "file.upload",
        serde_json::json!({"file_id": meta.file_id, "filename": meta.filename, "size_bytes": meta.size_bytes, "sha256": meta.sha256}),
        "ok",
    )
    .await;
    Ok(meta)
}

/// The caller's tenant's files, in the order they were stored.
pub async fn list(state: &Shared, caller: &Caller) -> Result<Vec<FileMeta>, ApiError> {
    let rows = state.db.files(&caller.tenant).await?;
    Ok(rows.into_iter().map(FileMeta::from).collect())
}

/// A stored file opened for reading.
#[derive(Debug)]
pub struct Download {
    pub meta: FileMeta,
    /// Its length on disk (what will be read).
    pub len: u64,
    pub file: tokio::fs::File,
}

/// Opens the caller's file `file_id` for reading: 404 for an unknown, expired or
/// other tenant's id. Audited as `file.download`.
pub async fn download(
    state: &Shared,
    caller: &Caller,
    file_id: &str,
) -> Result<Download, ApiError> {
    let (meta, path) = open(state, &caller.tenant, file_id).await?;
    let file = tokio::fs::File::open(&path).await.map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            // Expired and swept between the lookup and the open.
            ApiError::not_found(format!("no file {file_id}"))
        } else {
            ApiError::internal(format_args!("open {}: {e}", path.display()))
        }
    })?;
    let len = file.metadata().await?.len();
    audit::record(
        state,
        caller,
        None,
        "file.download",
        serde_json::json!({"file_id": meta.file_id, "filename": meta.filename}),
        "ok",
    )
    .await;
    Ok(Download { meta, len, file })
}

/// Deletes the caller's file `file_id` (row, blob and extracted bundle): 404 for
/// an unknown one, 409 while a live session mounts it. Audited as `file.delete`.
pub async fn delete(state: &Shared, caller: &Caller, file_id: &str) -> Result<(), ApiError> {
    let not_found = || ApiError::not_found(format!("no file {file_id}"));
    if !is_file_id(file_id) {
        return Err(not_found());
    }
    let held = crate::sessions::Held::File {
        tenant: caller.tenant.clone(),
        file_id: file_id.to_string(),
    };
    // Held while checking and deleting: no session create can claim it in between.
    let lock = state.holds.lock().await;
    let users = crate::sessions::users(state, &held);
    if !users.is_empty() || state.holds.pending(&held) > 0 {
        return Err(ApiError::conflict(format!(
            "file {file_id} is mounted by sessions {users:?}; delete them first"
        )));
    }
    let row = state
        .db
        .delete_file(&caller.tenant, file_id)
        .await?
        .ok_or_else(not_found)?;
    drop(lock);
    remove_blob(&tenant_dir(state, &caller.tenant), &row.id).await;
    audit::record(
        state,
        caller,
        None,
        "file.delete",
        serde_json::json!({"file_id": row.id, "filename": row.filename}),
        "ok",
    )
    .await;
    Ok(())
}

/// The bytes of disk the tenant's quota has left, and the quota. Read before a
/// file is written, so that a file the quota has no room for is not written first
/// (the count is checked again when the file is recorded, under the admission lock).
pub async fn disk_room(state: &Shared, tenant: &str) -> Result<(u64, u64), ApiError> {
    let max_disk = state.auth.quotas(tenant).await?.max_disk_bytes;
    let used = state
        .db
        .stored_bytes(tenant)
        .await?
        .saturating_add(reserved_disk(state, tenant));
    Ok((max_disk.saturating_sub(used), max_disk))
}

/// Records a stored file if the tenant's disk quota has room for it, counting its
/// live sessions' disk limits under the lock session creates (and snapshots, volume
/// growths) check the quota under: otherwise a create and an upload could each pass
/// on a count that leaves out the other.
async fn record_within_quota(state: &Shared, row: FileRow, max_disk: u64) -> Result<(), ApiError> {
    let _admission = match state.sessions.get() {
        Some(sessions) => Some(sessions.admit().await),
        None => None,
    };
    let reserved = reserved_disk(state, &row.tenant);
    state.db.insert_file_within(row, reserved, max_disk).await
}

/// The disk the tenant's live sessions hold (their `disk` limits), which its disk
/// quota counts together with what it stores (files, volumes, snapshots: see
/// `Db::stored_bytes`).
pub fn reserved_disk(state: &Shared, tenant: &str) -> u64 {
    state
        .sessions
        .get()
        .map_or(0, |sessions| sessions.usage(tenant).disk_bytes)
}

/// A file taken into a tenant's store whose row is not written yet: removed when
/// dropped unless [`record_blobs`] recorded it (and a crash before either is
/// cleaned up by [`sweep_orphans`]: a blob without a row).
pub struct Blob {
    row: FileRow,
    path: TempFile,
}

impl Blob {
    pub fn size_bytes(&self) -> u64 {
        self.row.size_bytes
    }
}

/// Copies `source` into `tenant`'s store as a [`Blob`], hashing it on the way;
/// blocking. Over `--max-file-size`: 413, nothing left.
pub fn take_blob(
    state: &Shared,
    tenant: &str,
    filename: &str,
    source: &mut dyn Read,
) -> Result<Blob, ApiError> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let max_size = state.args.max_file_size_bytes;
    let dir = tenant_dir(state, tenant);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(|e| ApiError::internal(format_args!("create {}: {e}", dir.display())))?;
    let id = new_file_id();
    let tmp = dir.join(format!("{TMP_PREFIX}{id}"));
    let mut guard = TempFile {
        path: Some(tmp.clone()),
    };
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| ApiError::internal(format_args!("create {}: {e}", tmp.display())))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; CHUNK];
    let mut size = 0u64;
    // One byte past the limit is enough to know it is over.
    let mut source = source.take(max_size.saturating_add(1));
    loop {
        let n = match source.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(ApiError::internal(format_args!("read {filename}: {e}"))),
        };
        if n == 0 {
            break;
        }
        size += n as u64;
        if size > max_size {
            return Err(ApiError::too_large(format!(
                "{filename} is over the limit of {max_size} bytes (--max-file-size)"
            )));
        }
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n])
            .map_err(|e| ApiError::internal(format_args!("write {}: {e}", tmp.display())))?;
    }
    drop(out);
    let path = dir.join(&id);
    std::fs::rename(&tmp, &path)
        .map_err(|e| ApiError::internal(format_args!("rename {}: {e}", tmp.display())))?;
    guard.disarm();
    Ok(Blob {
        row: FileRow {
            id,
            tenant: tenant.to_string(),
            filename: sanitize_filename(Some(filename)),
            size_bytes: size,
            sha256: hex::encode(hasher.finalize()),
            created_at: now_rfc3339(),
            expires_at: rfc3339_after(Duration::from_millis(state.args.file_ttl_ms)),
        },
        path: TempFile { path: Some(path) },
    })
}

/// Records `tenant`'s blobs, as many as its disk quota has room for, in order, in
/// one transaction (see [`crate::db::Db::insert_files_within`]): the file of each,
/// or `None` for one there was no room for (its blob is removed).
pub async fn record_blobs(
    state: &Shared,
    tenant: &str,
    blobs: Vec<Blob>,
) -> Result<Vec<Option<FileMeta>>, ApiError> {
    if blobs.is_empty() {
        return Ok(Vec::new());
    }
    let max_disk = state.auth.quotas(tenant).await?.max_disk_bytes;
    let rows: Vec<FileRow> = blobs.iter().map(|b| b.row.clone()).collect();
    // Under the lock session creates check the quota under, as for one file (see
    // record_within_quota).
    let recorded = {
        let _admission = match state.sessions.get() {
            Some(sessions) => Some(sessions.admit().await),
            None => None,
        };
        let reserved = reserved_disk(state, tenant);
        state
            .db
            .insert_files_within(rows, reserved, max_disk)
            .await?
    };
    let mut files = Vec::with_capacity(blobs.len());
    let mut unrecorded = Vec::new();
    for (mut blob, recorded) in blobs.into_iter().zip(recorded) {
        if recorded {
            blob.path.disarm();
            files.push(Some(blob.row.into()));
        } else {
            files.push(None);
            unrecorded.push(blob);
        }
    }
    if !unrecorded.is_empty() {
        // Possibly thousands of unlinks: not on the runtime's threads.
        tokio::task::spawn_blocking(move || drop(unrecorded));
    }
    Ok(files)
}

/// A tenant's file and where its bytes are: 404 `not_found` for an unknown, expired
/// or other tenant's id.
pub async fn open(
    state: &Shared,
    tenant: &str,
    file_id: &str,
) -> Result<(FileMeta, PathBuf), ApiError> {
    let not_found = || ApiError::not_found(format!("no file {file_id}"));
    if !is_file_id(file_id) {
        return Err(not_found());
    }
    let row = state
        .db
        .file(tenant, file_id)
        .await?
        .ok_or_else(not_found)?;
    let path = tenant_dir(state, tenant).join(&row.id);
    Ok((row.into(), path))
}

/// Most entries extracted from one bundle.
const MAX_BUNDLE_ENTRIES: u64 = 100_000;
/// The deepest path a bundle entry may have, in components. Unpacking checks every
/// new parent by resolving its whole path, so a path's cost grows with the square
/// of its depth: 20 entries 1,900 levels deep kept the daemon busy for over 12
/// minutes (and made 285,000 directories). Skill directories and the like are a
/// few levels deep.
const MAX_BUNDLE_DEPTH: usize = 64;
const BUNDLE_SUFFIX: &str = ".bundle";

/// Where [`bundle_dir`] extracts a tenant's uploaded tar file (404 for an id that
/// cannot be one).
pub fn bundle_path(shared: &Shared, tenant: &str, file_id: &str) -> Result<PathBuf, ApiError> {
    if !is_file_id(file_id) {
        return Err(ApiError::not_found(format!("no file {file_id}")));
    }
    Ok(tenant_dir(shared, tenant).join(format!("{file_id}{BUNDLE_SUFFIX}")))
}

/// The directory holding the extracted contents of an uploaded tar file (for
/// read-only session mounts), extracting it on first use into
/// `<data-dir>/files/<tenant>/<file_id>.bundle`. 404 for an unknown or other
/// tenant's id (the blob is looked up under the tenant's own directory), 422 if
/// the file is not a usable tar.
///
/// The extracted copy is disk the tenant takes as long as the file is kept, so its
/// quota counts it with the file: measured as [`extract_bundle`] counts it (the
/// blocks it takes, each entry at least one) and recorded under the lock quotas are
/// checked under, before the copy is put in place. An extraction may write no more
/// than the room the quota leaves, nor more than `--max-file-size`: a tar of empty
/// entries (512 bytes each) would otherwise take 8 times its size, uncounted.
/// `also`: disk the caller is about to take besides (the disk of the session being
/// created), which must fit too. `admitted`: the caller holds that lock already.
///
/// Extraction is contained: entries may not leave the directory (`..`, absolute
/// paths, paths through symlinks are refused by `tar::Entry::unpack_in`, and by
/// `hard_link_in` for hard links), only files, directories, symlinks and hard
/// links to files extracted before are created, set-id bits are dropped and
/// everything is made readable (sandbox users do not own these files).
pub async fn bundle_dir(
    shared: &Shared,
    tenant: &str,
    file_id: &str,
    also: u64,
    admitted: bool,
) -> Result<PathBuf, ApiError> {
    let target = bundle_path(shared, tenant, file_id)?;
    if tokio::fs::metadata(&target).await.is_ok_and(|m| m.is_dir()) {
        return Ok(target);
    }
    let max_disk = shared.auth.quotas(tenant).await?.max_disk_bytes;
    let used = shared
        .db
        .stored_bytes(tenant)
        .await?
        .saturating_add(reserved_disk(shared, tenant))
        .saturating_add(also);
    let room = max_disk.saturating_sub(used);
    let max_file = shared.args.max_file_size_bytes;
    let name = tenant.to_string();
    let over = move |needed: u64| {
        if room < max_file {
            ApiError::quota(format!(
                "the bundle unpacks to more than the {room} bytes left in tenant {name}'s \
                 disk quota (its extracted copy counts there with the file; GET \
                 /v1/tenants/{name} shows what counts)"
            ))
        } else {
            ApiError::too_large(format!(
                "the archive unpacks to more than {max_file} bytes of disk \
                 (--max-file-size; {needed} counted so far, each entry at least one 4 KiB block)"
            ))
        }
    };
    let dir = tenant_dir(shared, tenant);
    let blob = dir.join(file_id);
    let tmp = dir.join(format!("{TMP_PREFIX}{}{BUNDLE_SUFFIX}", new_file_id()));
    let remove_tmp = |tmp: PathBuf| async move {
        let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(tmp)).await;
    };
    let (tmp2, id) = (tmp.clone(), file_id.to_string());
    let extracted = tokio::task::spawn_blocking(move || {
        let file = match std::fs::File::open(&blob) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(ApiError::not_found(format!("no file {id}")))
            }
            Err(e) => {
                return Err(ApiError::internal(format_args!(
                    "open {}: {e}",
                    blob.display()
                )))
            }
        };
        extract_bundle(file, &tmp2, room.min(max_file), &over)
    })
    .await
    .map_err(|e| ApiError::internal(format_args!("bundle extraction failed: {e}")));
    let bytes = match extracted {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(e)) | Err(e) => {
            remove_tmp(tmp).await;
            return Err(e);
        }
    };
    let charged = {
        let _admission = match (admitted, shared.sessions.get()) {
            (false, Some(sessions)) => Some(sessions.admit().await),
            _ => None,
        };
        let reserved = reserved_disk(shared, tenant).saturating_add(also);
        shared
            .db
            .charge_bundle_within(tenant, file_id, bytes, reserved, max_disk)
            .await
    };
    if let Err(e) = charged {
        remove_tmp(tmp).await;
        return Err(e);
    }
    match tokio::fs::rename(&tmp, &target).await {
        Ok(()) => Ok(target),
        // Another request extracted it first: theirs is as good as ours (and
        // counted the same).
        Err(_) if tokio::fs::metadata(&target).await.is_ok_and(|m| m.is_dir()) => {
            remove_tmp(tmp).await;
            Ok(target)
        }
        Err(e) => {
            remove_tmp(tmp).await;
            Err(ApiError::internal(format_args!(
                "rename {}: {e}",
                target.display()
            )))
        }
    }
}

/// The disk an extracted entry of `size` bytes is counted to take: its 4 KiB
/// blocks, and one at least (a directory's block, an inode and a directory entry
/// for an empty file or a link), as the quota counts stored files.
fn entry_disk(size: u64) -> u64 {
    crate::db::charged_file_bytes(size)
}

/// The disk an entry's name takes in its directory: ext4's 8-byte record header and
/// the name padded to 4 bytes, twice, since the leaves of a large directory's index
/// are only half full after a split (2,000 short names grew a directory by 12
/// blocks, which one block per entry left uncounted).
fn name_disk(relative: &Path) -> u64 {
    use std::os::unix::ffi::OsStrExt;
    let name = relative
        .file_name()
        .map_or(0, |n| n.as_bytes().len() as u64);
    2 * (8 + name.next_multiple_of(4))
}

/// Extracts `file` into `dest` (made here) and returns the disk it takes, counted
/// by [`entry_disk`] and [`name_disk`]; `over(counted)` is the error once that
/// passes `cap`, checked before each entry is written.
fn extract_bundle(
    file: std::fs::File,
    dest: &Path,
    cap: u64,
    over: &dyn Fn(u64) -> ApiError,
) -> Result<u64, ApiError> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    use tar::EntryType;
    let mut total = entry_disk(0);
    if total > cap {
        return Err(over(total));
    }
    std::fs::DirBuilder::new()
        .mode(0o755)
        .create(dest)
        .map_err(|e| ApiError::internal(format_args!("create {}: {e}", dest.display())))?;
    let bad =
        |e: std::io::Error| ApiError::invalid(format!("the file is not a usable tar archive: {e}"));
    let mut archive = tar::Archive::new(std::io::BufReader::new(file));
    archive.set_preserve_permissions(false);
    archive.set_preserve_ownerships(false);
    archive.set_unpack_xattrs(false);
    archive.set_mask(0o022);
    let mut count = 0u64;
    // The regular files extracted so far: what a hard link may name.
    let mut files = std::collections::HashSet::new();
    // The directories that exist (or will, for the entry at hand), each counted
    // once: an entry's missing parents are made with it, and take disk too.
    let mut dirs = std::collections::HashSet::new();
    for entry in archive.entries().map_err(bad)? {
        let mut entry = entry.map_err(bad)?;
        count += 1;
        if count > MAX_BUNDLE_ENTRIES {
            return Err(ApiError::invalid(format!(
                "the archive has more than {MAX_BUNDLE_ENTRIES} entries"
            )));
        }
        let kind = entry.header().entry_type();
        if !matches!(
            kind,
            EntryType::Regular
                | EntryType::Continuous
                | EntryType::Directory
                | EntryType::Symlink
                | EntryType::Link
        ) {
            continue;
        }
        // Where unpack_in puts the entry: joining the raw name would put an
        // absolute one ("/etc/shadow") back on the host, for the chmod below.
        let name = entry.path().map_err(bad)?.into_owned();
        let Some(relative) = bundle_relative(&name) else {
            continue; // a name that climbs out: unpack_in skips it too
        };
        if relative.components().count() > MAX_BUNDLE_DEPTH {
            let shown: String = name.display().to_string().chars().take(200).collect();
            return Err(ApiError::invalid(format!(
                "archive entry {shown}...: deeper than {MAX_BUNDLE_DEPTH} levels"
            )));
        }
        // A hard link's size is its target's, which takes no more disk.
        let size = if kind == EntryType::Link {
            0
        } else {
            entry.size()
        };
        for parent in relative.ancestors().skip(1) {
            if parent.as_os_str().is_empty() || !dirs.insert(parent.to_path_buf()) {
                break; // made already, and so are the ones above it
            }
            total = total
                .saturating_add(entry_disk(0))
                .saturating_add(name_disk(parent));
        }
        if kind == EntryType::Directory && !dirs.insert(relative.clone()) {
            // Made already as a parent, and counted then.
        } else {
            total = total
                .saturating_add(entry_disk(size))
                .saturating_add(name_disk(&relative));
        }
        if total > cap {
            return Err(over(total));
        }
        if kind == EntryType::Link {
            let target = entry.link_name().map_err(bad)?.unwrap_or_default();
            hard_link_in(dest, &relative, &target, &files).map_err(|why| {
                ApiError::invalid(format!(
                    "archive entry {}: a hard link to {}, {why}",
                    name.display(),
                    target.display()
                ))
            })?;
            continue;
        }
        // The tar crate's unpack errors name host paths (`dest`, the data dir's):
        // the tenant is told the entry's name as the archive has it, nothing more.
        let unpacked = entry.unpack_in(dest).map_err(|e| {
            tracing::info!(error = %e, "a bundle entry is refused");
            let shown: String = name.display().to_string().chars().take(200).collect();
            // The refusal is a few errors deep (and its words are all there is).
            let why = if format!("{e:?}").contains("outside of destination") {
                "it would land outside the bundle (through a symlink of the archive?)".to_string()
            } else {
                e.kind().to_string()
            };
            ApiError::invalid(format!(
                "the file is not a usable tar archive: entry {shown}: {why}"
            ))
        })?;
        if !unpacked {
            continue;
        }
        if kind == EntryType::Symlink {
            files.remove(&relative);
            continue; // chmod would follow it
        }
        // unpack_in checked every parent; the entry itself was just created as a
        // file or directory, so this does not follow a symlink.
        let path = dest.join(&relative);
        let meta = std::fs::symlink_metadata(&path).map_err(bad)?;
        let mode = if meta.is_dir() || meta.permissions().mode() & 0o111 != 0 {
            0o755
        } else {
            0o644
        };
        if meta.is_dir() || meta.is_file() {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
                .map_err(|e| ApiError::internal(format_args!("chmod {}: {e}", path.display())))?;
        }
        if meta.is_file() {
            files.insert(relative);
        }
    }
    Ok(total)
}

/// Makes the hard link entry `relative` of a bundle being extracted in `dest`: a
/// link to `target`, which must be a regular file extracted earlier from the same
/// archive (`files`). The bundle is read-only, so a link is as good as a copy and
/// takes no disk. Missing parent directories are made, as for other entries; one
/// that is not a directory (a symlink the archive made) is refused, so the link
/// cannot land outside `dest`. Why it cannot be made, otherwise.
fn hard_link_in(
    dest: &Path,
    relative: &Path,
    target: &Path,
    files: &std::collections::HashSet<PathBuf>,
) -> Result<(), &'static str> {
    use std::os::unix::fs::DirBuilderExt;
    let Some(target) = bundle_relative(target).filter(|t| files.contains(t)) else {
        return Err("which is not a regular file earlier in the archive");
    };
    let Some(parent) = relative.parent() else {
        return Err("named as the bundle's own directory");
    };
    // Every directory on the way, both sides, must be a real one in `dest`.
    let real_dirs = |path: &Path, make: bool| -> Result<(), &'static str> {
        let mut at = dest.to_path_buf();
        for part in path.components() {
            at.push(part);
            match std::fs::symlink_metadata(&at) {
                Ok(meta) if meta.is_dir() => {}
                Err(e) if make && e.kind() == std::io::ErrorKind::NotFound => {
                    std::fs::DirBuilder::new()
                        .mode(0o755)
                        .create(&at)
                        .map_err(|_| "whose directory cannot be made")?;
                }
                _ => return Err("through something that is not a directory"),
            }
        }
        Ok(())
    };
    real_dirs(target.parent().unwrap_or(Path::new("")), false)?;
    real_dirs(parent, true)?;
    let (from, to) = (dest.join(&target), dest.join(relative));
    if !std::fs::symlink_metadata(&from).is_ok_and(|m| m.is_file()) {
        return Err("which is no longer a regular file");
    }
    // A later entry replaces an earlier one of the same name, as unpack_in does.
    match std::fs::symlink_metadata(&to) {
        Ok(meta) if meta.is_dir() => return Err("over a directory"),
        Ok(_) => std::fs::remove_file(&to).map_err(|_| "over an entry that cannot be removed")?,
        Err(_) => {}
    }
    std::fs::hard_link(&from, &to).map_err(|_| "which cannot be made")
}

/// An archive entry's name as a path under the bundle's directory, the way
/// `tar::Entry::unpack_in` places it (a leading `/` and `.` parts dropped); `None`
/// for a name with `..`, which it refuses.
fn bundle_relative(name: &Path) -> Option<PathBuf> {
    use std::path::Component;
    let mut relative = PathBuf::new();
    for part in name.components() {
        match part {
            Component::Normal(part) => relative.push(part),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
            Component::ParentDir => return None,
        }
    }
    Some(relative)
}

/// Removes the blob of a deleted or expired file and its extracted bundle, if any.
async fn remove_blob(dir: &Path, file_id: &str) {
    let path = dir.join(file_id);
    if let Err(e) = tokio::fs::remove_file(&path).await {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!(path = %path.display(), error = %e, "cannot remove a file");
        }
    }
    let bundle = dir.join(format!("{file_id}{BUNDLE_SUFFIX}"));
    if let Err(e) = tokio::fs::remove_dir_all(&bundle).await {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!(path = %bundle.display(), error = %e, "cannot remove an extracted bundle");
        }
    }
}

/// Removes a stored file (row and blob), e.g. an output of a run that then failed.
pub async fn discard(state: &Shared, tenant: &str, file_id: &str) {
    match state.db.delete_file(tenant, file_id).await {
        Ok(Some(row)) => remove_blob(&tenant_dir(state, tenant), &row.id).await,
        Ok(None) => {}
        Err(e) => tracing::warn!(file_id, error = %e.message, "cannot discard a file"),
    }
}

/// Deletes expired files (rows, then blobs); returns how many.
pub async fn expire_now(state: &Shared) -> Result<usize, ApiError> {
    // Files that live sessions mount stay until they are unused (the next pass).
    let lock = state.holds.lock().await;
    let in_use = crate::sessions::files_in_use(state);
    let rows = state.db.take_expired_files(now_rfc3339(), in_use).await?;
    drop(lock);
    for row in &rows {
        remove_blob(&tenant_dir(state, &row.tenant), &row.id).await;
        audit::record_system(
            state,
            &row.tenant,
            None,
            "file.expire",
            serde_json::json!({"file_id": row.id, "filename": row.filename, "size_bytes": row.size_bytes}),
            "ok",
        )
        .await;
    }
    if !rows.is_empty() {
        tracing::info!(count = rows.len(), "expired files deleted");
    }
    Ok(rows.len())
}

/// Runs [`expire_now`] at once and then every `interval`, until the state is gone.
pub fn spawn_expiry(state: &AppState, interval: Duration) -> tokio::task::JoinHandle<()> {
    crate::state::spawn_periodic(state, interval, |state| async move {
        if let Err(e) = expire_now(&state).await {
            tracing::warn!(error = %e, "file expiry failed; retrying later");
        }
    })
}

/// At startup (before serving): removes temporary files of interrupted uploads and
/// blobs that have no row (a crash between rename and insert).
pub async fn sweep_orphans(state: &Shared) -> anyhow::Result<()> {
    let known = state
        .db
        .file_ids()
        .await
        .map_err(|e| anyhow::anyhow!("cannot list files: {}", e.message))?;
    let root = state.files_dir();
    tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        let tenants = match std::fs::read_dir(&root) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(anyhow::anyhow!("cannot read {}: {e}", root.display())),
        };
        for tenant in tenants.flatten() {
            if !tenant.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let Ok(entries) = std::fs::read_dir(tenant.path()) else {
                continue;
            };
            for entry in entries.flatten() {
                let name = entry.file_name();
                let name = name.to_string_lossy();
                let id = name.strip_suffix(BUNDLE_SUFFIX).unwrap_or(&name);
                if !name.starts_with(TMP_PREFIX) && known.contains(id) {
                    continue;
                }
                let path = entry.path();
                let removed = if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    std::fs::remove_dir_all(&path)
                } else {
                    std::fs::remove_file(&path)
                };
                if let Err(e) = removed {
                    tracing::warn!(path = %path.display(), error = %e, "cannot remove an orphaned file");
                }
            }
        }
        Ok(())
    })
    .await?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_ids() {
        let id = new_file_id();
        assert!(is_file_id(&id), "{id}");
        assert_ne!(id, new_file_id());
        for bad in [
            "",
            "../etc/passwd",
            &"A".repeat(32),
            &"a".repeat(31),
            &"g".repeat(32),
        ] {
            assert!(!is_file_id(bad), "{bad}");
        }
    }

    #[test]
    fn bundle_entries_with_absolute_names_stay_in_the_bundle() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        // A host file and directory an archive names by their absolute paths.
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "secret").unwrap();
        std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
        let victim_dir = dir.path().join("victim-dir");
        std::fs::create_dir(&victim_dir).unwrap();
        std::fs::set_permissions(&victim_dir, std::fs::Permissions::from_mode(0o700)).unwrap();

        let mut builder = tar::Builder::new(Vec::new());
        let mut add = |name: &Path, kind: tar::EntryType, mode: u32, data: &[u8]| {
            let mut header = tar::Header::new_gnu();
            header.set_entry_type(kind);
            header.set_mode(mode);
            header.set_size(data.len() as u64);
            // set_path refuses absolute names; an attacker's archive is not so kind.
            let raw = name.as_os_str().as_encoded_bytes();
            header.as_old_mut().name[..raw.len()].copy_from_slice(raw);
            header.set_cksum();
            builder.append(&header, data).unwrap();
        };
        add(&victim, tar::EntryType::Regular, 0o600, b"x");
        add(&victim_dir, tar::EntryType::Directory, 0o700, b"");
        add(Path::new("../up"), tar::EntryType::Regular, 0o600, b"x");
        let archive = dir.path().join("bundle.tar");
        std::fs::write(&archive, builder.into_inner().unwrap()).unwrap();

        let dest = dir.path().join("bundle");
        extract_bundle(
            std::fs::File::open(&archive).unwrap(),
            &dest,
            1 << 20,
            &|n| ApiError::too_large(n.to_string()),
        )
        .unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode(&victim), 0o600);
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "secret");
        assert_eq!(mode(&victim_dir), 0o700);
        assert!(!dir.path().join("up").exists());
        // Inside the bundle, where they belong, readable by every sandbox user.
        let inside = dest.join(victim.strip_prefix("/").unwrap());
        assert_eq!(mode(&inside), 0o644);
        assert_eq!(
            mode(&dest.join(victim_dir.strip_prefix("/").unwrap())),
            0o755
        );
    }

    /// What an extraction may write is counted in the blocks it takes, not in
    /// its entries' sizes: empty entries are not free.
    #[test]
    fn bundle_extraction_counts_blocks_not_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let mut builder = tar::Builder::new(Vec::new());
        for i in 0..300 {
            let mut header = tar::Header::new_gnu();
            header.set_entry_type(tar::EntryType::Directory);
            header.set_mode(0o755);
            header.set_size(0);
            builder
                .append_data(&mut header, format!("d{i}"), std::io::empty())
                .unwrap();
        }
        let mut header = tar::Header::new_gnu();
        header.set_size(4097);
        header.set_mode(0o644);
        builder
            .append_data(&mut header, "f", &[b'x'; 4097][..])
            .unwrap();
        let archive = dir.path().join("dirs.tar");
        std::fs::write(&archive, builder.into_inner().unwrap()).unwrap();
        let extract = |cap: u64, dest: &str| {
            extract_bundle(
                std::fs::File::open(&archive).unwrap(),
                &dir.path().join(dest),
                cap,
                &|n| ApiError::too_large(n.to_string()),
            )
        };
        // The bundle's directory, 300 directories and a file of two blocks, and
        // their names ("d0".."d299", "f": 24 bytes counted for each).
        let needed = 301 * 4096 + 2 * 4096 + 301 * 24;
        let err = extract(needed - 1, "small").unwrap_err();
        assert_eq!(err.code.as_str(), "payload_too_large");
        assert_eq!(extract(needed, "enough").unwrap(), needed);
    }

    #[test]
    fn bundle_extraction_counts_the_parents_it_makes_and_refuses_deep_paths() {
        let dir = tempfile::tempdir().unwrap();
        let archive = |name: &str, entries: &[(&str, Option<&str>)]| {
            let mut builder = tar::Builder::new(Vec::new());
            for (path, link) in entries {
                let mut header = tar::Header::new_gnu();
                header.set_mode(0o644);
                header.set_size(if link.is_some() { 0 } else { 1 });
                match link {
                    Some(target) => {
                        header.set_entry_type(tar::EntryType::Link);
                        builder.append_link(&mut header, path, target).unwrap();
                    }
                    None => builder.append_data(&mut header, path, &b"x"[..]).unwrap(),
                }
            }
            let path = dir.path().join(name);
            std::fs::write(&path, builder.into_inner().unwrap()).unwrap();
            path
        };
        let extract = |tar: &Path, dest: &str| {
            extract_bundle(
                std::fs::File::open(tar).unwrap(),
                &dir.path().join(dest),
                u64::MAX,
                &|n| ApiError::too_large(n.to_string()),
            )
        };
        // No directory entries: "a", "a/b" and "a/b/c" are made all the same, and
        // each takes a block and its name; a hard link's parents too ("l", "l/m").
        let deep = archive(
            "deep.tar",
            &[
                ("a/b/c/f", None),
                ("a/b/g", None),
                ("l/m/n", Some("a/b/c/f")),
            ],
        );
        let counted = extract(&deep, "deep").unwrap();
        let names = |n: usize| 2 * (8 + (n as u64).next_multiple_of(4));
        let dirs = 5 * 4096 + 5 * names(1);
        // Two files of a byte, and the link (a block, as an empty file).
        let files = 3 * 4096 + 3 * names(1);
        assert_eq!(counted, 4096 + dirs + files);
        assert!(dir.path().join("deep/l/m/n").is_file());
        // Deeper than a bundle may go: refused before anything of it is made.
        let path = vec!["d"; MAX_BUNDLE_DEPTH + 1].join("/");
        let too_deep = archive("too_deep.tar", &[(&path, None)]);
        let err = extract(&too_deep, "too_deep").unwrap_err();
        assert_eq!(err.code.as_str(), "invalid_request", "{}", err.message);
        assert!(!dir.path().join("too_deep/d").exists());
        let path = vec!["d"; MAX_BUNDLE_DEPTH].join("/");
        extract(&archive("deepest.tar", &[(&path, None)]), "deepest").unwrap();
    }

    #[test]
    fn bundle_names() {
        let rel = |name: &str| bundle_relative(Path::new(name));
        assert_eq!(rel("/etc/shadow"), Some(PathBuf::from("etc/shadow")));
        assert_eq!(rel("./a/./b/"), Some(PathBuf::from("a/b")));
        assert_eq!(rel("a/../../b"), None);
        assert_eq!(rel("."), Some(PathBuf::new()));
    }

    #[test]
    fn filenames() {
        assert_eq!(sanitize_filename(Some("report.csv")), "report.csv");
        assert_eq!(sanitize_filename(Some("../../etc/passwd")), "passwd");
        assert_eq!(sanitize_filename(Some("C:\\x\\y.txt")), "y.txt");
        assert_eq!(sanitize_filename(Some("a\nb\0c")), "abc");
        assert_eq!(sanitize_filename(Some("..")), "file");
        assert_eq!(sanitize_filename(Some("dir/")), "file");
        assert_eq!(sanitize_filename(None), "file");
        let long = "é".repeat(300);
        let cut = sanitize_filename(Some(&long));
        assert!(cut.len() <= MAX_FILENAME_BYTES && cut.chars().all(|c| c == 'é'));
    }

    #[test]
    fn tenant_dirs() {
        assert_eq!(tenant_dir_name("acme"), "acme");
        assert_eq!(tenant_dir_name(""), "~");
        assert_eq!(tenant_dir_name("../x"), "~2e2e2f78");
    }
}
