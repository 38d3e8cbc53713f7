//! Reading the `snapshots` table as the API lists it (recording and deleting a
//! snapshot, with the layers its quota counts, stay beside the files' accounting in
//! the module root).

use rusqlite::{params, OptionalExtension};

use super::Db;
use crate::fault::Error as ApiError;

/// A snapshot as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredSnapshot {
    pub id: String,
    pub name: Option<String>,
    pub session_id: String,
    /// The base image; empty for a snapshot of a session on the host's system dirs.
    pub image: String,
    pub created_at: String,
    pub size_bytes: u64,
    /// Its session's bundle mounts, as JSON.
    pub mounts: Option<String>,
    /// Its session's network policy, as JSON (`egress::Network`).
    pub network: Option<String>,
}

fn row_to_snapshot(row: &rusqlite::Row<'_>) -> rusqlite::Result<StoredSnapshot> {
    Ok(StoredSnapshot {
        id: row.get(0)?,
        name: row.get(1)?,
        session_id: row.get(2)?,
        image: row.get(3)?,
        created_at: row.get(4)?,
        size_bytes: row.get::<_, i64>(5)? as u64,
        mounts: row.get(6)?,
        network: row.get(7)?,
    })
}

impl Db {
    /// One of the tenant's snapshots; `None` if it has none of that id.
    pub async fn snapshot(
        &self,
        tenant: &str,
        id: &str,
    ) -> Result<Option<StoredSnapshot>, ApiError> {
        let (tenant, id) = (tenant.to_string(), id.to_string());
        self.call(move |conn| {
            conn.query_row(
                "SELECT id, name, session_id, image, created_at, size_bytes, mounts, network FROM snapshots
                 WHERE id = ?1 AND tenant = ?2",
                params![id, tenant],
                row_to_snapshot,
            )
            .optional()
        })
        .await
    }

    /// The tenant's snapshots, oldest first.
    pub async fn snapshots(&self, tenant: &str) -> Result<Vec<StoredSnapshot>, ApiError> {
        let tenant = tenant.to_string();
        self.call(move |conn| {
            let mut stmt = conn.prepare(
                "SELECT id, name, session_id, image, created_at, size_bytes, mounts, network FROM snapshots
                 WHERE tenant = ?1 ORDER BY created_at, id",
            )?;
            let rows = stmt
                .query_map(params![tenant], row_to_snapshot)?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(rows)
        })
        .await
    }
}
