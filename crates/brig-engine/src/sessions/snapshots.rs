//! Snapshots: what a session wrote, kept to start sessions from (fork: any number
//! of them) or to restore a session to.
//!
//! - A session started from an image (or an image snapshot): its writes (the
//!   overlay's upper layer) become a new layer on top of its image (brig-image's
//!   snapshot, the same as `brig run --snapshot-to`). /tmp is not kept (it is a
//!   private tmpfs beside the image root).
//! - A session on the host's system dirs writes only its private /tmp and
//!   /workspace: they become one layer whose tree is `tmp/...` and `workspace/...`
//!   (an image of kind `scratch`, brig-image's `snapshot_scratch`), their whole
//!   content, so deletions need nothing. A fork or restore is a new sandbox on the
//!   host's system dirs whose /tmp and /workspace are filled from it as it starts
//!   (brig-jail's seed: a copy, costing time proportional to the snapshot's size,
//!   bounded by the new session's disk limit).
//!
//! Either is stored in the image store as image `snap-<id>`: one storage and one
//! delete path. The database maps it to its tenant, so one tenant never sees or
//! starts another's; its `image` column is the base image, empty for a host
//! snapshot.
//!
//! Snapshots count in their tenant's disk quota: the layers each holds beyond the
//! operator's images (`snapshot_layers`), each layer once per tenant. The size is
//! known only once the layer is packed, so the quota is checked then (and up front,
//! against a tenant already at its quota); a refused snapshot's image and new
//! layer are removed again, and deleting a snapshot removes what only it held.

use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;

use crate::backend::Captured;

use super::{
    ensure_not_deleted, freeze, limits_of, lookup, persist, prepare_bundles, spec_for, BundleMount,
    Held, Session, SessionInfo,
};
use crate::audit;
use crate::auth::Caller;
use crate::db::StoredSnapshot;
use crate::fault::{Error as ApiError, ErrorCode};
use crate::state::AppState;

/// A snapshot, as its tenant sees it.
#[derive(Debug, Clone)]
pub struct SnapshotInfo {
    pub snapshot_id: String,
    pub name: Option<String>,
    pub session_id: String,
    /// The image the session ran (the snapshot's base); empty for a snapshot of a
    /// session on the host's system dirs.
    pub image: String,
    /// What the snapshot holds: "image" (a layer on top of `image`) or "host" (the
    /// /tmp and /workspace of a session on the host's system dirs).
    pub base: String,
    pub created_at: String,
    /// Size of the new layer (compressed).
    pub size_bytes: u64,
    /// The session's bundle mounts (not part of the layer): a fork that gives no
    /// `mounts` gets these. Volumes are never part of a snapshot.
    pub mounts: Vec<BundleMount>,
}

fn image_name(snapshot_id: &str) -> String {
    format!("snap-{}", snapshot_id.trim_start_matches("snap_"))
}

const BASE_IMAGE: &str = "image";
const BASE_HOST: &str = "host";

/// What a session starts from when it starts from a snapshot.
pub struct Source {
    /// The snapshot's image in the store.
    pub image: String,
    /// A snapshot of a session on the host's system dirs.
    pub host: bool,
    /// The bundle mounts of the snapshotted session.
    pub mounts: Vec<BundleMount>,
    /// The network policy of the snapshotted session (`None`: it had no way out).
    pub network: Option<crate::egress::Network>,
}

impl Source {
    /// The `image` and `seed` of [`super::launch_sandbox`].
    pub fn start(&self) -> (Option<String>, Option<String>) {
        if self.host {
            (None, Some(self.image.clone()))
        } else {
            (Some(self.image.clone()), None)
        }
    }
}

/// A caller's snapshot to start from (404 for unknown or another tenant's).
pub async fn source(state: &AppState, tenant: &str, snapshot_id: &str) -> Result<Source, ApiError> {
    let row = state
        .db
        .snapshot(tenant, snapshot_id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no snapshot {snapshot_id}")))?;
    let network = row
        .network
        .as_deref()
        .and_then(|json| serde_json::from_str(json).ok());
    let info = info_of(row);
    Ok(Source {
        image: image_name(snapshot_id),
        host: info.base == BASE_HOST,
        mounts: info.mounts,
        network,
    })
}

/// [`source`], once a create or restore has claimed snapshot `snapshot_id`: 404 also
/// when its delete began before the claim, as if it were gone already.
pub async fn still_there(
    state: &AppState,
    tenant: &str,
    snapshot_id: &str,
) -> Result<Source, ApiError> {
    if state.holds.is_closing(&held(tenant, snapshot_id)) {
        return Err(ApiError::not_found(format!("no snapshot {snapshot_id}")));
    }
    source(state, tenant, snapshot_id).await
}

fn held(tenant: &str, snapshot_id: &str) -> Held {
    Held::Snapshot {
        tenant: tenant.to_string(),
        id: snapshot_id.to_string(),
    }
}

async fn stored(state: &AppState, tenant: &str, id: &str) -> Result<SnapshotInfo, ApiError> {
    let missing = ApiError::not_found(format!("no snapshot {id}"));
    state
        .db
        .snapshot(tenant, id)
        .await?
        .map(info_of)
        .ok_or(missing)
}

fn info_of(row: StoredSnapshot) -> SnapshotInfo {
    SnapshotInfo {
        snapshot_id: row.id,
        name: row.name,
        session_id: row.session_id,
        base: if row.image.is_empty() {
            BASE_HOST
        } else {
            BASE_IMAGE
        }
        .to_string(),
        image: row.image,
        created_at: row.created_at,
        size_bytes: row.size_bytes,
        mounts: row
            .mounts
            .and_then(|text| serde_json::from_str(&text).ok())
            .unwrap_or_default(),
    }
}

/// Snapshots session `id` (see [`snapshot`]), named `name` if given (audited as
/// `snapshot.create`).
pub async fn create(
    state: &AppState,
    caller: &Caller,
    id: &str,
    name: Option<String>,
) -> Result<SnapshotInfo, ApiError> {
    let result = async {
        let session = lookup(state, caller, id)?;
        snapshot(state, &session, name.clone()).await
    }
    .await;
    let outcome = audit::outcome(&result);
    let detail = serde_json::json!({
        "name": name,
        "snapshot_id": result.as_ref().ok().map(|s| s.snapshot_id.clone()),
    });
    audit::record(state, caller, Some(id), "snapshot.create", detail, outcome).await;
    result
}

/// Pauses the session, turns what it wrote into a new image, resumes it, and
/// records the snapshot if the tenant's disk quota has room for the layers it holds
/// (429 otherwise, with the image and its new layer removed again).
pub async fn snapshot(
    state: &AppState,
    session: &Arc<Session>,
    name: Option<String>,
) -> Result<SnapshotInfo, ApiError> {
    // Copying and packing cost the host CPU and disk: only so many at once.
    let _taking = state.auth.snapshot_permit(&session.tenant)?;
    let _running = crate::metrics::snapshot_started();
    // A snapshot only ever adds to what the tenant uses: at its quota already, it is
    // refused before the session is paused or anything is packed.
    let used = state
        .db
        .stored_bytes(&session.tenant)
        .await?
        .saturating_add(state.sessions().usage(&session.tenant).disk_bytes);
    let max = state.auth.quotas(&session.tenant).await?.max_disk_bytes;
    if used >= max {
        return Err(ApiError::quota(format!(
            "tenant {} uses {used} of its {max} bytes of disk, which leaves no room for a \
             snapshot; delete snapshots, files, volumes or sessions first",
            session.tenant
        )));
    }
    let _gate = session.gate.write().await;
    ensure_not_deleted(session)?;
    // Read under the gate: a restore that held it has replaced the sandbox (and its
    // base image), and the one read before would be gone.
    let sandbox = session.sandbox();
    let snapshot_id = format!("snap_{}", crate::auth::random_hex(12));
    let image = image_name(&snapshot_id);
    // Listed before anything is packed: a daemon that dies before the snapshot is
    // recorded (or its image removed again) leaves an image the next start removes.
    state.db.begin_snapshot_image(&image).await?;
    let taken = take(
        state,
        session,
        &*sandbox,
        name,
        (used, max),
        snapshot_id,
        &image,
    )
    .await;
    let left = taken.is_err() && image_exists(state, &image).await;
    if !left {
        if let Err(e) = state.db.end_snapshot_image(&image).await {
            tracing::warn!("snapshot image {image}: {}", e.message);
        }
    }
    taken
}

/// [`snapshot`], under the session's gate: takes the writes of `sandbox`, packs
/// them into `image` and records snapshot `snapshot_id` (removing the image again
/// if that fails). `used` and `max` are the tenant's disk use and quota.
async fn take(
    state: &AppState,
    session: &Arc<Session>,
    sandbox: &dyn crate::backend::Sandbox,
    name: Option<String>,
    (used, max): (u64, u64),
    snapshot_id: String,
    image: &str,
) -> Result<SnapshotInfo, ApiError> {
    let base = sandbox.facts().image.clone();
    let was_paused = session.paused.load(std::sync::atomic::Ordering::SeqCst);
    // Init is in the sandbox's cgroup: frozen, it cannot answer. So the descriptors
    // of what it writes are taken while it runs (a paused session is thawed for
    // that moment).
    if was_paused {
        freeze(session, false).await?;
    }
    let writes = sandbox
        .capture_writes(base.is_some())
        .await
        .map(|captured| match captured {
            Captured::Upper(fd) => Writes::Upper(fd),
            Captured::Scratch(dirs) => Writes::Scratch(dirs),
        });
    // The copy is the only step that needs the session still: its processes
    // frozen, and changes through the files API refused (or waited for) meanwhile.
    let staged = match writes {
        Ok(writes) => match session.cut.begin_copy(CHANGES_DRAIN).await {
            Some(_copying) => match freeze(session, true).await {
                Ok(()) => {
                    // What copying reads is bounded: the room left in the quota, or
                    // the session's own disk limit (all it can hold without holes).
                    let claimable = max.saturating_sub(used).max(session.disk_bytes);
                    // A paused session stays frozen while it is packed: a packer in
                    // its cgroup would be frozen too, so that one is the daemon's.
                    let charged = !was_paused;
                    stage(state, session, sandbox, writes, image, (claimable, charged)).await
                }
                Err(e) => Err(e),
            },
            None => Err(ApiError::conflict(format!(
                "files of session {} are being changed through the files API; take the \
                 snapshot once that ends",
                session.id
            ))),
        },
        Err(e) => Err(e),
    };
    // Packing reads the private copy alone: the session runs again meanwhile, and a
    // refused snapshot leaves it as it was.
    let thawed = freeze(session, was_paused).await;
    let staged = match (staged, thawed) {
        (Ok(staged), Ok(())) => staged,
        (Ok(_), Err(e)) | (Err(e), _) => return Err(e),
    };
    let packed = match commit(state, staged, image).await {
        Ok(packed) => packed,
        Err(e) => {
            discard(state, image).await;
            return Err(e);
        }
    };
    let info = SnapshotInfo {
        snapshot_id: snapshot_id.clone(),
        name,
        session_id: session.id.clone(),
        base: if base.is_some() {
            BASE_IMAGE
        } else {
            BASE_HOST
        }
        .to_string(),
        image: base.unwrap_or_default(),
        created_at: crate::db::now_rfc3339(),
        size_bytes: packed.size_bytes,
        mounts: session.request.mounts.clone().unwrap_or_default(),
    };
    let row = crate::db::SnapshotRow {
        id: snapshot_id,
        tenant: session.tenant.clone(),
        name: info.name.clone(),
        session_id: info.session_id.clone(),
        image: info.image.clone(),
        created_at: info.created_at.clone(),
        size_bytes: info.size_bytes,
        mounts: serde_json::to_string(&info.mounts).map_err(ApiError::internal)?,
        network: session
            .network()
            .map(|n| serde_json::to_string(&n))
            .transpose()
            .map_err(ApiError::internal)?,
        layers: packed.layers,
    };
    let recorded = {
        // Under the lock session creates check the quota under, so neither passes
        // on a count the other is about to change; the transaction does the same
        // for concurrent snapshots and uploads.
        let _admission = state.sessions().admission.lock().await;
        let reserved = state.sessions().usage(&session.tenant).disk_bytes;
        let max = state.auth.quotas(&session.tenant).await?.max_disk_bytes;
        state.db.insert_snapshot_within(row, reserved, max).await
    };
    if let Err(e) = recorded {
        discard(state, image).await;
        return Err(e);
    }
    Ok(info)
}

/// A snapshot's image, made: the size of its new layer and the layers it holds.
struct Packed {
    size_bytes: u64,
    layers: Vec<(String, u64)>,
}

/// How long a snapshot waits for changes under way through the files API to end
/// before it is refused (new ones are refused meanwhile).
const CHANGES_DRAIN: std::time::Duration = std::time::Duration::from_secs(10);

/// What the session wrote, copied out of its reach, with what packing it needs.
struct Staged {
    copy: brig_image::ops::Staged,
    writes: Writes,
    base: Option<String>,
    placeholders: Vec<String>,
    origin: String,
    /// The session's cgroups, which pay for the packing.
    charge_to: Vec<PathBuf>,
}

/// Copies what the session wrote into the store's work space (the session is
/// still), at most `claimable` bytes at apparent sizes: no packing, digest or
/// cleanup ever reads the session's own tree, which its tenant can change. With
/// `charged`, the packing that follows runs in the session's cgroup.
async fn stage(
    state: &AppState,
    session: &Session,
    sandbox: &dyn crate::backend::Sandbox,
    writes: Writes,
    image: &str,
    (claimable, charged): (u64, bool),
) -> Result<Staged, ApiError> {
    let store_dir = state.args.store.clone();
    let base = sandbox.facts().image.clone();
    let placeholders = sandbox.facts().placeholders.clone();
    let origin = format!("snapshot of session {}", session.id);
    let image = image.to_string();
    let charge_to = if charged {
        sandbox.charge_to()
    } else {
        Vec::new()
    };
    tokio::task::spawn_blocking(move || {
        let store = brig_image::store::Store::open(&store_dir)?;
        let copy = with_request(
            &store,
            base.as_deref(),
            &writes,
            &image,
            &placeholders,
            &origin,
            (claimable, &[]),
            |store, request| match request {
                Request::Upper(request) => {
                    brig_image::ops::stage_snapshot(store, &request, &brig_image::Silent)
                }
                Request::Scratch(request) => {
                    brig_image::ops::stage_scratch(store, &request, &brig_image::Silent)
                }
            },
        )?;
        Ok(Staged {
            copy,
            writes,
            base,
            placeholders,
            origin,
            charge_to,
        })
    })
    .await
    .map_err(ApiError::internal)?
    .map_err(|e| staging_error(e, claimable))
}

/// A failed copy, for the caller: the bounds and a changing tree are theirs to fix.
fn staging_error(e: brig_image::ImageError, claimable: u64) -> ApiError {
    use brig_image::ImageError;
    match e {
        ImageError::TooLarge(_) => ApiError::quota(format!(
            "the session's files claim more than {claimable} bytes (sparse files count at \
             their full size, which is what a snapshot reads), more than the tenant's disk \
             quota has room for"
        )),
        ImageError::Changed(message) => ApiError::conflict(message),
        ImageError::Busy(message) => ApiError::new(ErrorCode::Busy, message),
        // A name or a depth a layer cannot hold is the caller's to fix, like a bad path.
        ImageError::BadSource(message) => ApiError::invalid(message),
        e => ApiError::internal(format!("snapshot: {e}")),
    }
}

/// Packs a staged copy into image `image`: the size of its new layer and the
/// layers it holds. The image is removed again if measuring fails.
async fn commit(state: &AppState, staged: Staged, image: &str) -> Result<Packed, ApiError> {
    let store_dir = state.args.store.clone();
    let image = image.to_string();
    tokio::task::spawn_blocking(move || {
        let store = brig_image::store::Store::open(&store_dir)?;
        let Staged {
            copy,
            writes,
            base,
            placeholders,
            origin,
            charge_to,
        } = staged;
        let (record, base_layers) = with_request(
            &store,
            base.as_deref(),
            &writes,
            &image,
            &placeholders,
            &origin,
            (0, &charge_to),
            |store, request| match request {
                Request::Upper(request) => {
                    let base_layers = request.base.layers.len();
                    let record = brig_image::ops::commit_snapshot(
                        store,
                        &request,
                        copy,
                        &brig_image::Silent,
                    )?;
                    Ok((record, base_layers))
                }
                Request::Scratch(request) => Ok((
                    brig_image::ops::commit_scratch(store, &request, copy, &brig_image::Silent)?,
                    0,
                )),
            },
        )?;
        let measured = (|| {
            let layers = held_layers(&store, &record)?;
            // The new top layer, unless the session wrote nothing (same layers as
            // before).
            let size_bytes = match record.layers.last() {
                Some(top) if record.layers.len() > base_layers => store.layer(top)?.file_bytes,
                _ => 0,
            };
            Ok(Packed { size_bytes, layers })
        })();
        if measured.is_err() {
            let _ = store.discard_image(&image);
        }
        measured
    })
    .await
    .map_err(ApiError::internal)?
    .map_err(|e: brig_image::ImageError| match e {
        brig_image::ImageError::OutOfMemory(message) => {
            ApiError::new(ErrorCode::MemoryFull, message)
        }
        e => ApiError::internal(format!("snapshot: {e}")),
    })
}

/// brig-image's request for a snapshot of `writes`.
enum Request<'a> {
    Upper(brig_image::ops::Snapshot<'a>),
    Scratch(brig_image::ops::ScratchSnapshot<'a>),
}

/// Builds the request for a snapshot of `writes` into image `image` (on top of
/// image `base` for an upper layer), copying at most `max_bytes` and packing in
/// the cgroups of `charge_to`, and hands it to `f`.
#[allow(clippy::too_many_arguments)]
fn with_request<T>(
    store: &brig_image::store::Store,
    base: Option<&str>,
    writes: &Writes,
    image: &str,
    placeholders: &[String],
    origin: &str,
    (max_bytes, charge_to): (u64, &[PathBuf]),
    f: impl FnOnce(&brig_image::store::Store, Request<'_>) -> brig_image::Result<T>,
) -> brig_image::Result<T> {
    match (base, writes) {
        (Some(base), Writes::Upper(upper)) => {
            let base = store.image(base)?;
            f(
                store,
                Request::Upper(brig_image::ops::Snapshot {
                    base: &base,
                    name: image,
                    writes: upper.as_fd(),
                    placeholders,
                    // One mapped id: what the sandbox wrote belongs to it, and it
                    // stands for the image's root (see `brig run --snapshot-to`).
                    force_owner: Some((0, 0)),
                    replace: false,
                    max_bytes: Some(max_bytes),
                    charge_to,
                }),
            )
        }
        (_, Writes::Scratch(dirs)) => {
            let dirs: Vec<(&str, std::os::fd::BorrowedFd<'_>)> = dirs
                .iter()
                .map(|(name, fd)| (name.as_str(), fd.as_fd()))
                .collect();
            let exclude = scratch_exclusions(placeholders);
            f(
                store,
                Request::Scratch(brig_image::ops::ScratchSnapshot {
                    name: image,
                    dirs: &dirs,
                    exclude: &exclude,
                    // Everything there is the session user's: a fork's copy is its
                    // own user's, whatever is stored.
                    force_owner: Some((0, 0)),
                    origin,
                    max_bytes: Some(max_bytes),
                    charge_to,
                }),
            )
        }
        (None, Writes::Upper(_)) => Err(brig_image::ImageError::Unsupported(
            "an upper layer without a base image".into(),
        )),
    }
}

/// The layers of a snapshot's image that its tenant's disk quota counts, with their
/// file sizes: all but those of the operator's images (those not made by a
/// snapshot). A snapshot of a session started from another snapshot holds that
/// one's layers as well, which stay on disk as long as either image does; each
/// layer counts once per tenant however many of its snapshots hold it.
fn held_layers(
    store: &brig_image::store::Store,
    record: &brig_image::store::ImageRecord,
) -> Result<Vec<(String, u64)>, brig_image::ImageError> {
    let mut operator = std::collections::HashSet::new();
    if record.kind == brig_image::store::ImageKind::Root {
        for name in store.image_names()? {
            if !is_snapshot_image(&name) {
                // One removed meanwhile (or damaged) has no layers to give.
                if let Ok(image) = store.image(&name) {
                    operator.extend(image.layers);
                }
            }
        }
    }
    record
        .layers
        .iter()
        .filter(|digest| !operator.contains(*digest))
        .map(|digest| Ok((digest.clone(), store.layer(digest)?.file_bytes)))
        .collect()
}

/// Whether an image in the store is a snapshot's (see [`image_name`]).
pub(crate) fn is_snapshot_image(name: &str) -> bool {
    name.strip_prefix("snap-")
        .is_some_and(|hex| hex.len() == 24 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Removes a snapshot's image and the layers only it has, so that a refused
/// snapshot leaves nothing. A layer a sandbox still uses stays (`brig image gc`
/// takes it later). Failures are logged: the caller has a better error to give.
async fn discard(state: &AppState, image: &str) {
    let store_dir = state.args.store.clone();
    let name = image.to_string();
    let removed = tokio::task::spawn_blocking(move || {
        brig_image::store::Store::open(&store_dir)?.discard_image(&name)
    })
    .await;
    match removed {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => tracing::warn!("cannot remove the snapshot image {image}: {e}"),
        Err(e) => tracing::warn!("cannot remove the snapshot image {image}: {e}"),
    }
}

/// Whether the store has image `image` (a failure to look counts as yes: it is
/// then left for a daemon start to remove).
async fn image_exists(state: &AppState, image: &str) -> bool {
    let (store_dir, name) = (state.args.store.clone(), image.to_string());
    tokio::task::spawn_blocking(move || {
        brig_image::store::Store::open(&store_dir).map_or(true, |store| store.has_image(&name))
    })
    .await
    .unwrap_or(true)
}

/// At a daemon's start, before any session is started: removes the snapshot images
/// that a daemon killed while it made or removed them left in the store without a
/// snapshot row (see `Db::begin_snapshot_image`). Only the images listed there are
/// touched: the store may hold other daemons' snapshots. Layers a sandbox still uses
/// stay, as with every discard (`brig image gc` takes them later).
pub async fn remove_orphans(state: &crate::state::Shared) -> anyhow::Result<()> {
    let listed = state
        .db
        .snapshot_images(|image| {
            is_snapshot_image(image).then(|| format!("snap_{}", image.trim_start_matches("snap-")))
        })
        .await
        .map_err(|e| anyhow::anyhow!("cannot list snapshot images: {}", e.message))?;
    for (image, recorded) in listed {
        if !recorded && is_snapshot_image(&image) {
            let (store_dir, name) = (state.args.store.clone(), image.clone());
            let removed = tokio::task::spawn_blocking(move || {
                let store = brig_image::store::Store::open(&store_dir)?;
                if store.has_image(&name) {
                    store.discard_image(&name)?;
                }
                Ok::<_, brig_image::ImageError>(())
            })
            .await?;
            if let Err(e) = removed {
                tracing::warn!("cannot remove the orphaned snapshot image {image}: {e}");
                continue;
            }
            tracing::info!("removed snapshot image {image}, left without a snapshot");
        }
        state
            .db
            .end_snapshot_image(&image)
            .await
            .map_err(|e| anyhow::anyhow!("snapshot image {image}: {}", e.message))?;
    }
    Ok(())
}

/// What a session hands over for its snapshot (see brig-jail's `mounts::Writes`).
enum Writes {
    /// Its image root's upper layer.
    Upper(OwnedFd),
    /// Its private directories by name (`tmp`, `workspace`).
    Scratch(Vec<(String, OwnedFd)>),
}

/// What a host snapshot leaves out, relative to its tree: the daemon's own files
/// in /tmp (background processes' output, the execute driver) and the mount points
/// brig made below /tmp and /workspace (empty directories over which bundles were
/// bound; a fork that mounts them makes them again).
fn scratch_exclusions(placeholders: &[String]) -> Vec<PathBuf> {
    // Where `processes::JOBS_DIR` and the execute driver live.
    let mut exclude = vec![PathBuf::from("tmp/.brig")];
    for path in placeholders {
        let below = ["/tmp/", "/workspace/"]
            .iter()
            .any(|dir| path.starts_with(dir) && path.len() > dir.len());
        if below {
            exclude.push(PathBuf::from(path.trim_start_matches('/')));
        }
    }
    exclude
}

/// The caller's snapshots.
pub async fn list(state: &AppState, caller: &Caller) -> Result<Vec<SnapshotInfo>, ApiError> {
    Ok(state
        .db
        .snapshots(&caller.tenant)
        .await?
        .into_iter()
        .map(info_of)
        .collect())
}

/// The caller's snapshot `id` (404 for unknown or another tenant's).
pub async fn get(state: &AppState, caller: &Caller, id: &str) -> Result<SnapshotInfo, ApiError> {
    stored(state, &caller.tenant, id).await
}

/// Deletes the caller's snapshot `id`, once the sessions being started from it
/// hold its layers (audited as `snapshot.delete`).
pub async fn delete(state: &AppState, caller: &Caller, id: &str) -> Result<(), ApiError> {
    let (task_state, tenant, task_id) = (state.clone(), caller.tenant.clone(), id.to_string());
    // In its own task: once closed, the snapshot must be removed (or reopened) even if
    // the client hangs up while the starts under way finish.
    let result = tokio::spawn(async move {
        let (state, id) = (task_state, task_id);
        stored(&state, &tenant, &id).await?;
        // Starts of sessions from it that claimed it before this go on (their image
        // must stay until their sandbox holds its layers); later ones are 404.
        let _closing = state.holds.close(held(&tenant, &id)).await;
        state.holds.settled(&held(&tenant, &id)).await;
        // The row goes first, and only the delete that removes it goes on to the
        // image: concurrent deletes of one snapshot would otherwise race to remove
        // the same image file (the loser was a 500). The others are 404, as if they
        // came after. A daemon that dies before the image is gone leaves an image
        // without a row, which the next start removes (`remove_orphans`).
        let image = image_name(&id);
        if !state.db.delete_snapshot(&tenant, &id, &image).await? {
            return Err(ApiError::not_found(format!("no snapshot {id}")));
        }
        let store_dir = state.args.store.clone();
        // Its layers go with it unless another image has them (a fork's snapshot)
        // or a session running from it holds them: those go when the last such
        // session ends (`release_deleted_snapshot_layers`).
        let name = image.clone();
        tokio::task::spawn_blocking(move || {
            let store = brig_image::store::Store::open(&store_dir)?;
            if store.has_image(&name) {
                store.discard_image(&name)?;
            }
            Ok::<_, brig_image::ImageError>(())
        })
        .await
        .map_err(ApiError::internal)?
        .map_err(|e| ApiError::internal(format!("remove snapshot image: {e}")))?;
        state.db.end_snapshot_image(&image).await?;
        Ok(())
    })
    .await
    .map_err(ApiError::internal)
    .and_then(|r| r);
    let outcome = audit::outcome(&result);
    audit::record(
        state,
        caller,
        None,
        "snapshot.delete",
        serde_json::json!({"snapshot_id": id}),
        outcome,
    )
    .await;
    result
}

/// Replaces the sandbox of session `id` with a new one started from the caller's
/// snapshot `snapshot_id` (audited as `session.restore`).
pub async fn restore(
    state: &AppState,
    caller: &Caller,
    id: &str,
    snapshot_id: &str,
) -> Result<SessionInfo, ApiError> {
    let result = async {
        let session = lookup(state, caller, id)?;
        // Until its sandbox runs, the snapshot's delete waits (or this is 404).
        let _claim = state
            .holds
            .claim(vec![held(&caller.tenant, snapshot_id)])
            .await;
        let (image, seed) = still_there(state, &caller.tenant, snapshot_id)
            .await?
            .start();
        let _gate = session.gate.write().await;
        // A delete that finished while this waited (for the snapshot's row, for the
        // gate) would otherwise see a sandbox started for a session that is gone.
        ensure_not_deleted(&session)?;
        let limits = limits_of(&session.request)?;
        // The session keeps its own mounts and volume (held while it lives).
        let mut spec = spec_for(state, &caller.tenant, &session.request, &limits)?;
        // The session keeps its network policy, served for the new sandbox.
        let network = session.network();
        let policies = network
            .as_ref()
            .map(|n| crate::egress::policies(state, &caller.tenant, n))
            .transpose()?;
        if network.is_some() {
            crate::egress::offer(&mut spec);
        }
        // And its secrets, with the same placeholders.
        if !session.secrets.is_empty() {
            let ca = state.egress.ca()?;
            crate::secrets::offer(&mut spec, &session.secrets, ca.cert_pem());
        }
        // The session's disk is reserved already: it is live.
        prepare_bundles(state, &caller.tenant, &session.request, 0, false).await?;
        // The new sandbox gets its own socket beside the old one, then replaces it.
        // Nothing of the old sandbox changes until the new one is ready (a snapshot
        // larger than the session's disk fails here).
        let process_base = super::processes::next_base(state, &session).await?;
        let launched =
            super::launch_from(state, &session.id, spec, (image, seed), false, process_base)
                .await?;
        let proxy = match policies {
            Some(policies) => {
                let attached = crate::egress::attach(
                    state,
                    &caller.tenant,
                    &session.id,
                    &launched,
                    policies,
                    &session.secrets,
                    true,
                )
                .await;
                match attached {
                    Ok(proxy) => Some(proxy),
                    Err(e) => {
                        let _ = launched.destroy().await;
                        launched.forget().await;
                        return Err(e);
                    }
                }
            }
            None => None,
        };
        let old = session.replace_sandbox(launched);
        session.set_proxy(proxy);
        let _ = old.destroy().await;
        super::release_deleted_snapshot_layers(state, &*old).await;
        old.forget().await;
        session
            .paused
            .store(false, std::sync::atomic::Ordering::SeqCst);
        persist(state, &session, "running").await?;
        super::processes::end_replaced(state, &session, process_base).await;
        super::watch_exit(state, &session);
        Ok(session.info())
    }
    .await;
    let outcome = audit::outcome(&result);
    audit::record(
        state,
        caller,
        Some(id),
        "session.restore",
        serde_json::json!({"snapshot_id": snapshot_id}),
        outcome,
    )
    .await;
    result
}
