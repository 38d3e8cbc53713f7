//! The catalog: every piece of state the engine's verbs keep (tenants, keys,
//! quotas, sessions, processes, files, snapshots with their layers and images,
//! volumes, audit), behind one object-safe trait. The verbs hold an
//! `Arc<dyn Catalog>` and never see how it is stored, so a second implementation
//! (etcd, for several daemons sharing tenants) fills this one seam. The SQLite
//! [`Db`](crate::db::Db) is the implementation today; only startup names it.
//!
//! A method's contract is what its doc says, not what SQLite happens to do: where
//! it says *atomic*, the check and the write it names must not be separable by a
//! concurrent call (an etcd implementation needs a transaction, a compare-and-swap
//! on a revision, or a lease there). Times are strings in the stored form of
//! [`crate::db::rfc3339`] (fixed width, so string order is time order), and an
//! implementation compares them as strings.

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;

use crate::db::{
    AuditFilter, AuditRow, FileRow, KeyRow, NewAuditEvent, NewProcessRow, ProcessRow, QuotaUpdate,
    SessionRow, SnapshotRow, StoredSession, StoredSnapshot, TenantRow, VolumeRow,
};
use crate::fault::Error;

/// What a catalog operation returns: boxed, so that the trait stays usable as
/// `dyn Catalog` (an `async fn` in a trait is not object-safe).
pub type CatalogFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, Error>> + Send + 'a>>;

/// The engine's state. Every operation is durable once its future resolves `Ok`
/// (a daemon restarted after that sees it); one that fails has changed nothing
/// unless its doc says otherwise. Failures of the store itself are `internal`
/// (or `unavailable`); the other error codes a method may answer are in its doc.
pub trait Catalog: Send + Sync {
    /// Starts the store's own background upkeep (SQLite: checkpointing the WAL
    /// off the request path), for as long as the runtime runs. Called once, when
    /// the daemon starts serving; an implementation with none does nothing.
    fn spawn_upkeep(&self);

    // -----------------------------------------------------------------------------
    // Tenants and quotas

    /// Creates the tenant (no quotas set) unless it exists; true if this call
    /// created it. Atomic: of concurrent calls for one name, one creates.
    fn ensure_tenant<'a>(&'a self, name: &'a str) -> CatalogFuture<'a, bool>;

    /// One tenant; `None` if there is none of that name.
    fn tenant<'a>(&'a self, name: &'a str) -> CatalogFuture<'a, Option<TenantRow>>;

    /// Every tenant, by name.
    fn tenants(&self) -> CatalogFuture<'_, Vec<TenantRow>>;

    /// Applies `update` to an existing tenant's quotas and returns the tenant as
    /// it now is; `None` (and nothing written) if there is no such tenant. Atomic
    /// read-modify-write: two concurrent updates of different quotas both stay.
    fn update_tenant_quotas<'a>(
        &'a self,
        name: &'a str,
        update: QuotaUpdate,
    ) -> CatalogFuture<'a, Option<TenantRow>>;

    /// The tenant's sessions that have a row (live, or being deleted).
    fn live_session_count<'a>(&'a self, tenant: &'a str) -> CatalogFuture<'a, u64>;

    // -----------------------------------------------------------------------------
    // Keys

    /// Stores a new key under `hash` (unique among keys), creating its tenant if
    /// new; false, and nothing stored, if the key id is taken. Atomic: the id
    /// check, the tenant and the key go in together.
    fn insert_key(&self, key: KeyRow, hash: String) -> CatalogFuture<'_, bool>;

    /// The live (not revoked) key stored under this hash.
    fn key_by_hash<'a>(&'a self, hash: &'a str) -> CatalogFuture<'a, Option<KeyRow>>;

    /// Keys of one tenant, or of every tenant with `None`, in creation order.
    fn keys<'a>(&'a self, tenant: Option<&'a str>) -> CatalogFuture<'a, Vec<KeyRow>>;

    /// Marks a key revoked and returns it as it now is; `None` if unknown.
    /// Idempotent: a key revoked twice keeps its first revocation time.
    fn revoke_key<'a>(&'a self, id: &'a str) -> CatalogFuture<'a, Option<KeyRow>>;

    /// Whether the tenant has a key that is not revoked.
    fn has_live_key<'a>(&'a self, tenant: &'a str) -> CatalogFuture<'a, bool>;

    // -----------------------------------------------------------------------------
    // Files and the disk quota

    /// Records a stored file if the tenant's [`Catalog::stored_bytes`] with it
    /// (the file counted as [`crate::db::charged_file_bytes`]) plus `reserved`
    /// (its sessions' disks, which the catalog does not know) stays within
    /// `max_disk_bytes`; `quota_exceeded` otherwise. Atomic: the quota is checked
    /// and the file inserted in one transaction, so two concurrent uploads (or an
    /// upload and a snapshot) cannot both slip under the quota.
    fn insert_file_within(
        &self,
        file: FileRow,
        reserved: u64,
        max_disk_bytes: u64,
    ) -> CatalogFuture<'_, ()>;

    /// Records, in order, the files of one tenant that fit in its quota as
    /// [`Catalog::insert_file_within`] would one by one (a file that does not fit
    /// is skipped, later ones may still fit); returns which were recorded. Atomic
    /// as one transaction: the quota is read once, and the batch is committed
    /// once (thousands of files, one sync). `internal` for a batch of several
    /// tenants; an empty batch records nothing.
    fn insert_files_within(
        &self,
        files: Vec<FileRow>,
        reserved: u64,
        max_disk_bytes: u64,
    ) -> CatalogFuture<'_, Vec<bool>>;

    /// Charges the tenant's file `id` with `bytes` for its bundle's extracted
    /// copy (replacing the earlier charge), if the tenant's stored bytes with it
    /// plus `reserved` stay within `max_disk_bytes`, or the charge does not grow:
    /// `quota_exceeded` otherwise, `not_found` for a file no longer recorded.
    /// Atomic: the file's existence, the quota and the charge in one transaction.
    fn charge_bundle_within<'a>(
        &'a self,
        tenant: &'a str,
        id: &'a str,
        bytes: u64,
        reserved: u64,
        max_disk_bytes: u64,
    ) -> CatalogFuture<'a, ()>;

    /// A tenant's file that has not expired (another tenant's is `None`).
    fn file<'a>(&'a self, tenant: &'a str, id: &'a str) -> CatalogFuture<'a, Option<FileRow>>;

    /// A tenant's files that have not expired, in upload order.
    fn files<'a>(&'a self, tenant: &'a str) -> CatalogFuture<'a, Vec<FileRow>>;

    /// Deletes a tenant's file (expired or not) and returns it as it was; `None`
    /// if there is none. Atomic: of concurrent deletes, one gets the row (and so
    /// removes the blob).
    fn delete_file<'a>(
        &'a self,
        tenant: &'a str,
        id: &'a str,
    ) -> CatalogFuture<'a, Option<FileRow>>;

    /// Deletes the files expired at `now` (`expires_at <= now`), but those in
    /// `keep`, and returns them, for their blobs to be removed. Atomic: a file is
    /// returned by exactly one call, and only if its row is gone.
    fn take_expired_files(
        &self,
        now: String,
        keep: HashSet<String>,
    ) -> CatalogFuture<'_, Vec<FileRow>>;

    /// Every recorded file id, expired or not (for the sweep of orphaned blobs).
    fn file_ids(&self) -> CatalogFuture<'_, HashSet<String>>;

    /// Disk the tenant's recorded files take, as
    /// [`crate::db::charged_file_bytes`] counts each, plus their bundles' charges.
    fn file_bytes<'a>(&'a self, tenant: &'a str) -> CatalogFuture<'a, u64>;

    /// Bytes a tenant keeps on disk outside its sessions, what its disk quota
    /// counts besides them: [`Catalog::file_bytes`], its volumes' capacity and
    /// [`Catalog::snapshot_bytes`]. Asked on every session create: it must be
    /// cheap.
    fn stored_bytes<'a>(&'a self, tenant: &'a str) -> CatalogFuture<'a, u64>;

    /// Bytes of the layers the tenant's snapshots hold, each digest once however
    /// many of its snapshots hold it.
    fn snapshot_bytes<'a>(&'a self, tenant: &'a str) -> CatalogFuture<'a, u64>;

    // -----------------------------------------------------------------------------
    // Snapshots, their layers and their images

    /// Records a snapshot and the layers it holds if the tenant's
    /// [`Catalog::stored_bytes`] with them (a layer it holds already adds
    /// nothing) plus `reserved` stays within `max_disk_bytes`; `quota_exceeded`,
    /// and nothing recorded, otherwise. Atomic: checked and inserted in one
    /// transaction, as [`Catalog::insert_file_within`].
    fn insert_snapshot_within(
        &self,
        snapshot: SnapshotRow,
        reserved: u64,
        max_disk_bytes: u64,
    ) -> CatalogFuture<'_, ()>;

    /// Deletes a tenant's snapshot and its layers (freeing in the quota those no
    /// other of its snapshots holds), and lists its store image `image` as being
    /// removed (see [`Catalog::begin_snapshot_image`]); false, and nothing
    /// changed, if the tenant has no such snapshot. Atomic: the row, its layers
    /// and the listing together, so a daemon dying after it still removes the
    /// image at its next start.
    fn delete_snapshot<'a>(
        &'a self,
        tenant: &'a str,
        id: &'a str,
        image: &'a str,
    ) -> CatalogFuture<'a, bool>;

    /// Lists a snapshot image about to be made (or removed) in the image store:
    /// until [`Catalog::end_snapshot_image`], a starting daemon removes it unless
    /// a snapshot records it by then. Idempotent.
    fn begin_snapshot_image<'a>(&'a self, image: &'a str) -> CatalogFuture<'a, ()>;

    /// The image listed by [`Catalog::begin_snapshot_image`] is recorded or
    /// removed: unlisted. Idempotent.
    fn end_snapshot_image<'a>(&'a self, image: &'a str) -> CatalogFuture<'a, ()>;

    /// The listed snapshot images, each with whether a snapshot (of the id
    /// `id_of` gives for the image's name) records it.
    fn snapshot_images(
        &self,
        id_of: fn(&str) -> Option<String>,
    ) -> CatalogFuture<'_, Vec<(String, bool)>>;

    /// One of the tenant's snapshots; `None` if it has none of that id.
    fn snapshot<'a>(
        &'a self,
        tenant: &'a str,
        id: &'a str,
    ) -> CatalogFuture<'a, Option<StoredSnapshot>>;

    /// The tenant's snapshots, oldest first.
    fn snapshots<'a>(&'a self, tenant: &'a str) -> CatalogFuture<'a, Vec<StoredSnapshot>>;

    // -----------------------------------------------------------------------------
    // Sessions
    //
    // The methods named `*_quick` keep the contract of the one without the suffix;
    // they are for a request's hot path, where an implementation may answer on the
    // caller's thread (SQLite does, unless another writer holds the lock).

    /// Every session row (warm pool sandboxes' too), for a starting daemon.
    fn stored_sessions(&self) -> CatalogFuture<'_, Vec<StoredSession>>;

    /// Removes an ended session's row and its processes' rows, atomically: the
    /// catalog keeps live sessions only (their history is in the audit log).
    fn forget_session<'a>(&'a self, id: &'a str) -> CatalogFuture<'a, ()>;

    /// [`Catalog::forget_session`], on a request's hot path.
    fn forget_session_quick<'a>(&'a self, id: &'a str) -> CatalogFuture<'a, ()>;

    /// Deletes a session's row alone (a pool sandbox's: it has no processes).
    fn delete_session_row<'a>(&'a self, id: &'a str) -> CatalogFuture<'a, ()>;

    /// [`Catalog::delete_session_row`], on a request's hot path.
    fn delete_session_row_quick<'a>(&'a self, id: &'a str) -> CatalogFuture<'a, ()>;

    /// Records a warm pool sandbox (state `pooled`, no tenant) made at `now`.
    fn insert_pooled_session(
        &self,
        id: String,
        image: Option<String>,
        runtime: String,
        backend: &'static str,
        now: String,
    ) -> CatalogFuture<'_, ()>;

    /// Records a new session with what goes with it: the removal of the row of
    /// the pool sandbox it took (`pool_row`) and its create event (with its
    /// detail as text). Atomic: all or none, so a restart never finds a sandbox
    /// both pooled and a session's, nor a session without its create event.
    fn insert_session(
        &self,
        row: SessionRow,
        pool_row: Option<String>,
        event: Option<(NewAuditEvent, String)>,
    ) -> CatalogFuture<'_, ()>;

    /// Updates the state, sandbox and activity of the session's row if it still
    /// has one; returns how many rows changed (0: the session is gone, and stays
    /// gone: never inserted again). Atomic per row: a row marked `deleting` keeps
    /// that state (it takes the new sandbox, for a restarted daemon to destroy),
    /// never written back as live.
    fn update_session(&self, row: SessionRow) -> CatalogFuture<'_, usize>;

    /// Marks a session `deleting`: from now on a starting daemon destroys it.
    fn mark_session_deleting<'a>(&'a self, id: &'a str) -> CatalogFuture<'a, ()>;

    /// Saves the last activity of sessions, as (id, time), in one transaction;
    /// a session without a row is skipped.
    fn save_last_active(&self, changed: Vec<(String, String)>) -> CatalogFuture<'_, ()>;

    /// Updates a session's terms (expiry and idle timeout, its stored request, its
    /// network policy); returns how many rows changed (0: it is gone).
    fn update_session_terms(
        &self,
        id: String,
        expiry: (Option<String>, Option<i64>),
        request: String,
        network: Option<String>,
    ) -> CatalogFuture<'_, usize>;

    // -----------------------------------------------------------------------------
    // Background processes

    /// Records a process as started, replacing one of the same session and id.
    fn insert_process(&self, row: NewProcessRow) -> CatalogFuture<'_, ()>;

    /// The highest process id (compared as a number) the session has used; 0 if
    /// none.
    fn highest_process_id<'a>(&'a self, session_id: &'a str) -> CatalogFuture<'a, u64>;

    /// Ends now, as killed by `signal`, the session's running processes numbered
    /// up to `base`.
    fn end_processes_through<'a>(
        &'a self,
        session_id: &'a str,
        base: u64,
        signal: Option<i32>,
    ) -> CatalogFuture<'a, ()>;

    /// Ends a running process now with its exit status; one already ended keeps
    /// its first end.
    fn end_process<'a>(
        &'a self,
        session_id: &'a str,
        id: &'a str,
        code: Option<i32>,
        signal: Option<i32>,
    ) -> CatalogFuture<'a, ()>;

    /// The ids of the session's processes not ended.
    fn running_process_ids<'a>(&'a self, session_id: &'a str) -> CatalogFuture<'a, Vec<String>>;

    /// The session's processes in the order of their ids (as numbers); only `job`
    /// if given.
    fn processes<'a>(
        &'a self,
        session_id: &'a str,
        job: Option<u64>,
    ) -> CatalogFuture<'a, Vec<ProcessRow>>;

    // -----------------------------------------------------------------------------
    // Volumes

    /// Whether the tenant has a volume of that name.
    fn volume_exists<'a>(&'a self, tenant: &'a str, name: &'a str) -> CatalogFuture<'a, bool>;

    /// [`Catalog::volume_exists`], on a session create's path.
    fn volume_exists_quick<'a>(&'a self, tenant: &'a str, name: &'a str)
        -> CatalogFuture<'a, bool>;

    /// Records the volume with `capacity` unless the tenant has one of that name;
    /// returns whether this call recorded it and the capacity now recorded.
    /// Atomic: of concurrent creates one records, and each reads the capacity
    /// that won.
    fn ensure_volume<'a>(
        &'a self,
        tenant: &'a str,
        name: &'a str,
        created_at: String,
        capacity: u64,
    ) -> CatalogFuture<'a, (bool, u64)>;

    /// The recorded capacity of a tenant's volume; `None` if there is no such
    /// volume.
    fn volume_capacity<'a>(
        &'a self,
        tenant: &'a str,
        name: &'a str,
    ) -> CatalogFuture<'a, Option<u64>>;

    /// Sets the recorded capacity of a tenant's volume (nothing if it has none).
    fn set_volume_capacity<'a>(
        &'a self,
        tenant: &'a str,
        name: &'a str,
        capacity: u64,
    ) -> CatalogFuture<'a, ()>;

    /// Forgets a tenant's volume (nothing if it has none).
    fn delete_volume<'a>(&'a self, tenant: &'a str, name: &'a str) -> CatalogFuture<'a, ()>;

    /// The capacity of all the tenant's volumes (part of its disk quota).
    fn volume_capacity_total<'a>(&'a self, tenant: &'a str) -> CatalogFuture<'a, u64>;

    /// Every volume of every tenant, as (tenant, name).
    fn all_volumes(&self) -> CatalogFuture<'_, Vec<(String, String)>>;

    /// Records the bytes an unmounted volume uses, measured now.
    fn record_volume_size<'a>(
        &'a self,
        tenant: &'a str,
        name: &'a str,
        used: u64,
    ) -> CatalogFuture<'a, ()>;

    /// The tenant's volumes by name; only the one called `only` if given.
    fn volumes<'a>(
        &'a self,
        tenant: &'a str,
        only: Option<&'a str>,
    ) -> CatalogFuture<'a, Vec<VolumeRow>>;

    // -----------------------------------------------------------------------------
    // Audit

    /// Appends an event; returns its id. Ids grow in the order events become
    /// visible: once [`Catalog::max_audit_id`] returned `n`, no event of id `n` or
    /// less appears later (the export pages by id up to it).
    fn insert_audit(&self, event: NewAuditEvent) -> CatalogFuture<'_, i64>;

    /// Appends events in one transaction, in their order (a batch of connections
    /// of sessions' egress proxies).
    fn insert_audits(&self, events: Vec<NewAuditEvent>) -> CatalogFuture<'_, ()>;

    /// The id of the newest event; 0 if there is none.
    fn max_audit_id(&self) -> CatalogFuture<'_, i64>;

    /// Removes up to `batch` of the events older than `cutoff`, oldest (by time,
    /// not id) first; returns how many went. Bounded by `batch`, so retention
    /// never holds the store for long.
    fn prune_audit(&self, cutoff: String, batch: u32) -> CatalogFuture<'_, usize>;

    /// Events matching `filter`, in id order, at most `filter.limit`.
    fn audit_events(&self, filter: AuditFilter) -> CatalogFuture<'_, Vec<AuditRow>>;
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::db::{now_rfc3339, rfc3339_after, rfc3339_before, Db};

    /// A catalog as the engine holds it: nothing below may reach past the trait.
    fn catalog() -> (tempfile::TempDir, Arc<dyn Catalog>) {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("brig.db")).unwrap();
        (dir, Arc::new(db))
    }

    const K: u64 = 4096;

    fn file(id: &str, size: u64, expires_at: String) -> FileRow {
        FileRow {
            id: id.into(),
            tenant: "t".into(),
            filename: id.into(),
            size_bytes: size,
            sha256: String::new(),
            created_at: now_rfc3339(),
            expires_at,
        }
    }

    /// Uploads racing for the last of a quota: the check and the insert are one
    /// step, so no more land than fit, whatever the interleaving.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_uploads_cannot_both_slip_under_the_quota() {
        let (_dir, catalog) = catalog();
        let uploads = (0..8).map(|i| {
            let catalog = catalog.clone();
            let later = rfc3339_after(Duration::from_secs(60));
            tokio::spawn(async move {
                catalog
                    .insert_file_within(file(&format!("f{i}"), 40 * K, later), 0, 100 * K)
                    .await
            })
        });
        let mut landed = 0;
        for upload in uploads.collect::<Vec<_>>() {
            match upload.await.unwrap() {
                Ok(()) => landed += 1,
                Err(e) => assert_eq!(e.code.as_str(), "quota_exceeded"),
            }
        }
        assert_eq!(landed, 2);
        assert_eq!(catalog.stored_bytes("t").await.unwrap(), 80 * K);
        assert_eq!(catalog.files("t").await.unwrap().len(), 2);
    }

    /// A refused snapshot leaves nothing behind; a layer two snapshots hold counts
    /// once; deleting one lists its image for removal in the same step.
    #[tokio::test]
    async fn snapshots_are_recorded_and_deleted_whole() {
        let (_dir, catalog) = catalog();
        let snapshot = |id: &str, layers: &[(&str, u64)]| SnapshotRow {
            id: id.into(),
            tenant: "t".into(),
            name: None,
            session_id: "ses_1".into(),
            image: "alpine".into(),
            created_at: now_rfc3339(),
            size_bytes: 0,
            mounts: "[]".into(),
            network: None,
            layers: layers.iter().map(|(d, n)| (d.to_string(), *n)).collect(),
        };
        catalog
            .insert_snapshot_within(snapshot("snap_a", &[("sha256:1", 40 * K)]), 0, 100 * K)
            .await
            .unwrap();
        let err = catalog
            .insert_snapshot_within(
                snapshot("snap_b", &[("sha256:1", 40 * K), ("sha256:2", 61 * K)]),
                0,
                100 * K,
            )
            .await
            .unwrap_err();
        assert_eq!(err.code.as_str(), "quota_exceeded");
        assert!(catalog.snapshot("t", "snap_b").await.unwrap().is_none());
        assert_eq!(catalog.snapshot_bytes("t").await.unwrap(), 40 * K);
        catalog
            .insert_snapshot_within(
                snapshot("snap_b", &[("sha256:1", 40 * K), ("sha256:2", 60 * K)]),
                0,
                100 * K,
            )
            .await
            .unwrap();
        assert_eq!(catalog.snapshot_bytes("t").await.unwrap(), 100 * K);

        assert!(!catalog
            .delete_snapshot("u", "snap_a", "snap-a")
            .await
            .unwrap());
        assert!(catalog
            .delete_snapshot("t", "snap_a", "snap-a")
            .await
            .unwrap());
        assert_eq!(catalog.snapshot_bytes("t").await.unwrap(), 100 * K);
        let id_of = |image: &str| image.strip_prefix("snap-").map(|hex| format!("snap_{hex}"));
        assert_eq!(
            catalog.snapshot_images(id_of).await.unwrap(),
            [("snap-a".to_string(), false)]
        );
        let ids: Vec<String> = catalog
            .snapshots("t")
            .await
            .unwrap()
            .into_iter()
            .map(|s| s.id)
            .collect();
        assert_eq!(ids, ["snap_b"]);
    }

    /// A session takes its pool sandbox's row and writes its create event in one
    /// step; once marked deleting it is never written back as live, and once gone
    /// never comes back.
    #[tokio::test]
    async fn a_session_row_goes_in_whole_and_never_comes_back() {
        let (_dir, catalog) = catalog();
        let now = now_rfc3339();
        catalog
            .insert_pooled_session(
                "pool_1".into(),
                None,
                "{}".into(),
                "namespaces",
                now.clone(),
            )
            .await
            .unwrap();
        let row = SessionRow {
            id: "ses_1".into(),
            tenant: "t".into(),
            state: "running".into(),
            image: None,
            snapshot: None,
            request: "{}".into(),
            runtime: "{}".into(),
            backend: "namespaces".into(),
            created_at: now.clone(),
            expires_at: None,
            idle_timeout_s: None,
            last_active_at: now.clone(),
            network: Some(r#"{"mode":"open","allow":[],"deny":[]}"#.into()),
            secrets: Some("[]".into()),
        };
        let event = NewAuditEvent {
            time: now.clone(),
            tenant: "t".into(),
            key_id: None,
            frontend: "rest",
            session_id: Some("ses_1".into()),
            action: "session.create".into(),
            detail: serde_json::Value::Null,
            outcome: "ok".into(),
        };
        catalog
            .insert_session(
                row.clone(),
                Some("pool_1".into()),
                Some((event, "{}".into())),
            )
            .await
            .unwrap();
        let stored = catalog.stored_sessions().await.unwrap();
        let ids: Vec<&str> = stored.iter().map(|s| s.id.as_str()).collect();
        assert_eq!(ids, ["ses_1"]);
        assert_eq!(stored[0].network, row.network);
        assert_eq!(stored[0].secrets, row.secrets);
        // A policy change is written with the terms; `None` (no way out) stays so.
        let changed = Some(r#"{"mode":"none","allow":[],"deny":[]}"#.to_string());
        let terms = (None, Some(60));
        let updated = catalog
            .update_session_terms("ses_1".into(), terms, "{}".into(), changed.clone())
            .await
            .unwrap();
        assert_eq!(updated, 1);
        assert_eq!(catalog.stored_sessions().await.unwrap()[0].network, changed);
        let events = catalog
            .audit_events(AuditFilter {
                session_id: Some("ses_1".into()),
                limit: 10,
                ..AuditFilter::default()
            })
            .await
            .unwrap();
        assert_eq!(events.len(), 1);
        assert_eq!(catalog.live_session_count("t").await.unwrap(), 1);

        catalog.mark_session_deleting("ses_1").await.unwrap();
        assert_eq!(catalog.update_session(row.clone()).await.unwrap(), 1);
        let stored = catalog.stored_sessions().await.unwrap();
        assert_eq!(stored[0].state, "deleting");
        catalog.forget_session("ses_1").await.unwrap();
        assert_eq!(catalog.update_session(row).await.unwrap(), 0);
        assert!(catalog.stored_sessions().await.unwrap().is_empty());
    }

    /// Of racing creates of one tenant, one creates it; a key id is never taken
    /// twice; an expired file is handed to one sweeper only.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn check_and_write_operations_have_one_winner() {
        let (_dir, catalog) = catalog();
        let creates: Vec<_> = (0..8)
            .map(|_| {
                let catalog = catalog.clone();
                tokio::spawn(async move { catalog.ensure_tenant("acme").await })
            })
            .collect();
        let mut created = 0;
        for create in creates {
            created += usize::from(create.await.unwrap().unwrap());
        }
        assert_eq!(created, 1);

        let key = KeyRow {
            id: "key_00000001".into(),
            tenant: "acme".into(),
            name: None,
            created_at: now_rfc3339(),
            revoked_at: None,
        };
        assert!(catalog.insert_key(key.clone(), "h1".into()).await.unwrap());
        assert!(!catalog.insert_key(key, "h2".into()).await.unwrap());
        assert!(catalog.key_by_hash("h2").await.unwrap().is_none());
        assert_eq!(catalog.keys(Some("acme")).await.unwrap().len(), 1);

        let past = rfc3339_before(Duration::from_secs(60));
        let files = (0..20)
            .map(|i| file(&format!("f{i}"), 1, past.clone()))
            .collect();
        catalog
            .insert_files_within(files, 0, u64::MAX)
            .await
            .unwrap();
        let sweeps: Vec<_> = (0..4)
            .map(|_| {
                let catalog = catalog.clone();
                tokio::spawn(async move {
                    catalog
                        .take_expired_files(now_rfc3339(), Default::default())
                        .await
                })
            })
            .collect();
        let mut taken = Vec::new();
        for sweep in sweeps {
            taken.extend(sweep.await.unwrap().unwrap().into_iter().map(|f| f.id));
        }
        taken.sort();
        taken.dedup();
        assert_eq!(taken.len(), 20, "each file once");
        assert!(catalog.file_ids().await.unwrap().is_empty());
    }

    /// The Rust sources of the engine outside `db/`, and of the server above it.
    fn sources_outside_db() -> Vec<(std::path::PathBuf, String)> {
        fn walk(dir: &Path, out: &mut Vec<(std::path::PathBuf, String)>) {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    // The engine's own tests may set up in SQL what no verb makes
                    // (a row of another backend); they are not the engine.
                    if path.file_name().is_some_and(|n| n != "db" && n != "tests") {
                        walk(&path, out);
                    }
                } else if path.extension().is_some_and(|e| e == "rs") {
                    let text = std::fs::read_to_string(&path).unwrap();
                    out.push((path, text));
                }
            }
        }
        let engine = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut out = Vec::new();
        walk(&engine.join("src"), &mut out);
        // The server reaches the engine's state through `Shared::db` alone.
        walk(&engine.join("../brig-server/src"), &mut out);
        assert!(out.len() > 20, "the sources were not found");
        out
    }

    /// The catalog is all the engine's verbs see of their state: outside `db/`,
    /// nothing names SQLite, and the concrete `Db` only where it is opened (and
    /// imported for that). Comments do not count.
    #[test]
    fn outside_db_the_state_is_the_catalog() {
        // Spelled in two halves, so that this file does not trip its own check.
        let sql_crate = ["rusq", "lite"].concat();
        let db_type = ["D", "b"].concat();
        let mut found = Vec::new();
        for (path, text) in sources_outside_db() {
            for (n, line) in text.lines().enumerate() {
                let code = line.split("//").next().unwrap_or_default();
                let at = format!("{}:{}: {}", path.display(), n + 1, line.trim());
                if code.contains(&sql_crate) {
                    found.push(at.clone());
                }
                let is_import = code.trim_start().starts_with("use ");
                for (i, _) in code.match_indices(&db_type) {
                    let ident = |c: char| c.is_alphanumeric() || c == '_';
                    let before = code[..i].chars().next_back();
                    let after = &code[i + db_type.len()..];
                    if before.is_some_and(ident) || after.chars().next().is_some_and(ident) {
                        continue;
                    }
                    if !is_import && !after.starts_with("::open(") {
                        found.push(at.clone());
                    }
                }
            }
        }
        assert!(found.is_empty(), "past the catalog:\n{}", found.join("\n"));
    }
}
