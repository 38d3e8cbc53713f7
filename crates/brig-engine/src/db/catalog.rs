//! The SQLite database as the engine's [`Catalog`]: each operation is the `Db`
//! method of the same name, whose SQL (and transaction) keeps the contract the
//! trait states.

use std::collections::HashSet;

use super::{
    AuditFilter, AuditRow, Db, FileRow, KeyRow, NewAuditEvent, NewProcessRow, ProcessRow,
    QuotaUpdate, SessionRow, SnapshotRow, StoredSession, StoredSnapshot, TenantRow, VolumeRow,
};
use crate::catalog::{Catalog, CatalogFuture};

// `Db::name(self, ..)` rather than `self.name(..)`: the inherent method, spelled so
// that a rename there cannot turn this into the trait method calling itself.
impl Catalog for Db {
    fn spawn_upkeep(&self) {
        self.spawn_checkpoints();
    }

    fn ensure_tenant<'a>(&'a self, name: &'a str) -> CatalogFuture<'a, bool> {
        Box::pin(Db::ensure_tenant(self, name))
    }

    fn tenant<'a>(&'a self, name: &'a str) -> CatalogFuture<'a, Option<TenantRow>> {
        Box::pin(Db::tenant(self, name))
    }

    fn tenants(&self) -> CatalogFuture<'_, Vec<TenantRow>> {
        Box::pin(Db::tenants(self))
    }

    fn update_tenant_quotas<'a>(
        &'a self,
        name: &'a str,
        update: QuotaUpdate,
    ) -> CatalogFuture<'a, Option<TenantRow>> {
        Box::pin(Db::update_tenant_quotas(self, name, update))
    }

    fn live_session_count<'a>(&'a self, tenant: &'a str) -> CatalogFuture<'a, u64> {
        Box::pin(Db::live_session_count(self, tenant))
    }

    fn insert_key(&self, key: KeyRow, hash: String) -> CatalogFuture<'_, bool> {
        Box::pin(Db::insert_key(self, key, hash))
    }

    fn key_by_hash<'a>(&'a self, hash: &'a str) -> CatalogFuture<'a, Option<KeyRow>> {
        Box::pin(Db::key_by_hash(self, hash))
    }

    fn keys<'a>(&'a self, tenant: Option<&'a str>) -> CatalogFuture<'a, Vec<KeyRow>> {
        Box::pin(Db::keys(self, tenant))
    }

    fn revoke_key<'a>(&'a self, id: &'a str) -> CatalogFuture<'a, Option<KeyRow>> {
        Box::pin(Db::revoke_key(self, id))
    }

    fn has_live_key<'a>(&'a self, tenant: &'a str) -> CatalogFuture<'a, bool> {
        Box::pin(Db::has_live_key(self, tenant))
    }

    fn insert_file_within(
        &self,
        file: FileRow,
        reserved: u64,
        max_disk_bytes: u64,
    ) -> CatalogFuture<'_, ()> {
        Box::pin(Db::insert_file_within(self, file, reserved, max_disk_bytes))
    }

    fn insert_files_within(
        &self,
        files: Vec<FileRow>,
        reserved: u64,
        max_disk_bytes: u64,
    ) -> CatalogFuture<'_, Vec<bool>> {
        Box::pin(Db::insert_files_within(
            self,
            files,
            reserved,
            max_disk_bytes,
        ))
    }

    fn charge_bundle_within<'a>(
        &'a self,
        tenant: &'a str,
        id: &'a str,
        bytes: u64,
        reserved: u64,
        max_disk_bytes: u64,
    ) -> CatalogFuture<'a, ()> {
        Box::pin(Db::charge_bundle_within(
            self,
            tenant,
            id,
            bytes,
            reserved,
            max_disk_bytes,
        ))
    }

    fn file<'a>(&'a self, tenant: &'a str, id: &'a str) -> CatalogFuture<'a, Option<FileRow>> {
        Box::pin(Db::file(self, tenant, id))
    }

    fn files<'a>(&'a self, tenant: &'a str) -> CatalogFuture<'a, Vec<FileRow>> {
        Box::pin(Db::files(self, tenant))
    }

    fn delete_file<'a>(
        &'a self,
        tenant: &'a str,
        id: &'a str,
    ) -> CatalogFuture<'a, Option<FileRow>> {
        Box::pin(Db::delete_file(self, tenant, id))
    }

    fn take_expired_files(
        &self,
        now: String,
        keep: HashSet<String>,
    ) -> CatalogFuture<'_, Vec<FileRow>> {
        Box::pin(Db::take_expired_files(self, now, keep))
    }

    fn file_ids(&self) -> CatalogFuture<'_, HashSet<String>> {
        Box::pin(Db::file_ids(self))
    }

    fn file_bytes<'a>(&'a self, tenant: &'a str) -> CatalogFuture<'a, u64> {
        Box::pin(Db::file_bytes(self, tenant))
    }

    fn stored_bytes<'a>(&'a self, tenant: &'a str) -> CatalogFuture<'a, u64> {
        Box::pin(Db::stored_bytes(self, tenant))
    }

    fn snapshot_bytes<'a>(&'a self, tenant: &'a str) -> CatalogFuture<'a, u64> {
        Box::pin(Db::snapshot_bytes(self, tenant))
    }

    fn insert_snapshot_within(
        &self,
        snapshot: SnapshotRow,
        reserved: u64,
        max_disk_bytes: u64,
    ) -> CatalogFuture<'_, ()> {
        Box::pin(Db::insert_snapshot_within(
            self,
            snapshot,
            reserved,
            max_disk_bytes,
        ))
    }

    fn delete_snapshot<'a>(
        &'a self,
        tenant: &'a str,
        id: &'a str,
        image: &'a str,
    ) -> CatalogFuture<'a, bool> {
        Box::pin(Db::delete_snapshot(self, tenant, id, image))
    }

    fn begin_snapshot_image<'a>(&'a self, image: &'a str) -> CatalogFuture<'a, ()> {
        Box::pin(Db::begin_snapshot_image(self, image))
    }

    fn end_snapshot_image<'a>(&'a self, image: &'a str) -> CatalogFuture<'a, ()> {
        Box::pin(Db::end_snapshot_image(self, image))
    }

    fn snapshot_images(
        &self,
        id_of: fn(&str) -> Option<String>,
    ) -> CatalogFuture<'_, Vec<(String, bool)>> {
        Box::pin(Db::snapshot_images(self, id_of))
    }

    fn snapshot<'a>(
        &'a self,
        tenant: &'a str,
        id: &'a str,
    ) -> CatalogFuture<'a, Option<StoredSnapshot>> {
        Box::pin(Db::snapshot(self, tenant, id))
    }

    fn snapshots<'a>(&'a self, tenant: &'a str) -> CatalogFuture<'a, Vec<StoredSnapshot>> {
        Box::pin(Db::snapshots(self, tenant))
    }

    fn stored_sessions(&self) -> CatalogFuture<'_, Vec<StoredSession>> {
        Box::pin(Db::stored_sessions(self))
    }

    fn forget_session<'a>(&'a self, id: &'a str) -> CatalogFuture<'a, ()> {
        Box::pin(Db::forget_session(self, id))
    }

    fn forget_session_quick<'a>(&'a self, id: &'a str) -> CatalogFuture<'a, ()> {
        Box::pin(Db::forget_session_quick(self, id))
    }

    fn delete_session_row<'a>(&'a self, id: &'a str) -> CatalogFuture<'a, ()> {
        Box::pin(Db::delete_session_row(self, id))
    }

    fn delete_session_row_quick<'a>(&'a self, id: &'a str) -> CatalogFuture<'a, ()> {
        Box::pin(Db::delete_session_row_quick(self, id))
    }

    fn insert_pooled_session(
        &self,
        id: String,
        image: Option<String>,
        runtime: String,
        backend: &'static str,
        now: String,
    ) -> CatalogFuture<'_, ()> {
        Box::pin(Db::insert_pooled_session(
            self,
            id,
            image,
            (runtime, backend),
            now,
        ))
    }

    fn insert_session(
        &self,
        row: SessionRow,
        pool_row: Option<String>,
        event: Option<(NewAuditEvent, String)>,
    ) -> CatalogFuture<'_, ()> {
        Box::pin(Db::insert_session(self, row, pool_row, event))
    }

    fn update_session(&self, row: SessionRow) -> CatalogFuture<'_, usize> {
        Box::pin(Db::update_session(self, row))
    }

    fn mark_session_deleting<'a>(&'a self, id: &'a str) -> CatalogFuture<'a, ()> {
        Box::pin(Db::mark_session_deleting(self, id))
    }

    fn save_last_active(&self, changed: Vec<(String, String)>) -> CatalogFuture<'_, ()> {
        Box::pin(Db::save_last_active(self, changed))
    }

    fn update_session_terms(
        &self,
        id: String,
        expiry: (Option<String>, Option<i64>),
        request: String,
        network: Option<String>,
    ) -> CatalogFuture<'_, usize> {
        Box::pin(Db::update_session_terms(self, id, expiry, request, network))
    }

    fn insert_process(&self, row: NewProcessRow) -> CatalogFuture<'_, ()> {
        Box::pin(Db::insert_process(self, row))
    }

    fn highest_process_id<'a>(&'a self, session_id: &'a str) -> CatalogFuture<'a, u64> {
        Box::pin(Db::highest_process_id(self, session_id))
    }

    fn end_processes_through<'a>(
        &'a self,
        session_id: &'a str,
        base: u64,
        signal: Option<i32>,
    ) -> CatalogFuture<'a, ()> {
        Box::pin(Db::end_processes_through(self, session_id, base, signal))
    }

    fn end_process<'a>(
        &'a self,
        session_id: &'a str,
        id: &'a str,
        code: Option<i32>,
        signal: Option<i32>,
    ) -> CatalogFuture<'a, ()> {
        Box::pin(Db::end_process(self, session_id, id, code, signal))
    }

    fn running_process_ids<'a>(&'a self, session_id: &'a str) -> CatalogFuture<'a, Vec<String>> {
        Box::pin(Db::running_process_ids(self, session_id))
    }

    fn processes<'a>(
        &'a self,
        session_id: &'a str,
        job: Option<u64>,
    ) -> CatalogFuture<'a, Vec<ProcessRow>> {
        Box::pin(Db::processes(self, session_id, job))
    }

    fn volume_exists<'a>(&'a self, tenant: &'a str, name: &'a str) -> CatalogFuture<'a, bool> {
        Box::pin(Db::volume_exists(self, tenant, name))
    }

    fn volume_exists_quick<'a>(
        &'a self,
        tenant: &'a str,
        name: &'a str,
    ) -> CatalogFuture<'a, bool> {
        Box::pin(Db::volume_exists_quick(self, tenant, name))
    }

    fn ensure_volume<'a>(
        &'a self,
        tenant: &'a str,
        name: &'a str,
        created_at: String,
        capacity: u64,
    ) -> CatalogFuture<'a, (bool, u64)> {
        Box::pin(Db::ensure_volume(self, tenant, name, created_at, capacity))
    }

    fn volume_capacity<'a>(
        &'a self,
        tenant: &'a str,
        name: &'a str,
    ) -> CatalogFuture<'a, Option<u64>> {
        Box::pin(Db::volume_capacity(self, tenant, name))
    }

    fn set_volume_capacity<'a>(
        &'a self,
        tenant: &'a str,
        name: &'a str,
        capacity: u64,
    ) -> CatalogFuture<'a, ()> {
        Box::pin(Db::set_volume_capacity(self, tenant, name, capacity))
    }

    fn delete_volume<'a>(&'a self, tenant: &'a str, name: &'a str) -> CatalogFuture<'a, ()> {
        Box::pin(Db::delete_volume(self, tenant, name))
    }

    fn volume_capacity_total<'a>(&'a self, tenant: &'a str) -> CatalogFuture<'a, u64> {
        Box::pin(Db::volume_capacity_total(self, tenant))
    }

    fn all_volumes(&self) -> CatalogFuture<'_, Vec<(String, String)>> {
        Box::pin(Db::all_volumes(self))
    }

    fn record_volume_size<'a>(
        &'a self,
        tenant: &'a str,
        name: &'a str,
        used: u64,
    ) -> CatalogFuture<'a, ()> {
        Box::pin(Db::record_volume_size(self, tenant, name, used))
    }

    fn volumes<'a>(
        &'a self,
        tenant: &'a str,
        only: Option<&'a str>,
    ) -> CatalogFuture<'a, Vec<VolumeRow>> {
        Box::pin(Db::volumes(self, tenant, only))
    }

    fn insert_audit(&self, event: NewAuditEvent) -> CatalogFuture<'_, i64> {
        Box::pin(Db::insert_audit(self, event))
    }

    fn insert_audits(&self, events: Vec<NewAuditEvent>) -> CatalogFuture<'_, ()> {
        Box::pin(Db::insert_audits(self, events))
    }

    fn max_audit_id(&self) -> CatalogFuture<'_, i64> {
        Box::pin(Db::max_audit_id(self))
    }

    fn prune_audit(&self, cutoff: String, batch: u32) -> CatalogFuture<'_, usize> {
        Box::pin(Db::prune_audit(self, cutoff, batch))
    }

    fn audit_events(&self, filter: AuditFilter) -> CatalogFuture<'_, Vec<AuditRow>> {
        Box::pin(Db::audit_events(self, filter))
    }
}
