//! The `volumes` table: a tenant's named volumes, their capacity and the size they
//! were last measured at.

use rusqlite::{params, Connection, OptionalExtension};

use super::{from_sql_int, now_rfc3339, to_sql_int, Db};
use crate::fault::Error as ApiError;

/// A volume as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeRow {
    pub name: String,
    pub capacity_bytes: u64,
    pub created_at: String,
    /// Its bytes in use when it was last unmounted.
    pub size_bytes: u64,
}

fn count_volume(conn: &Connection, tenant: &str, name: &str) -> rusqlite::Result<i64> {
    conn.prepare_cached("SELECT COUNT(*) FROM volumes WHERE tenant = ?1 AND name = ?2")?
        .query_row([tenant, name], |row| row.get::<_, i64>(0))
}

impl Db {
    /// Whether the tenant has a volume of that name.
    pub async fn volume_exists(&self, tenant: &str, name: &str) -> Result<bool, ApiError> {
        let (t, n) = (tenant.to_string(), name.to_string());
        Ok(self.call(move |conn| count_volume(conn, &t, &n)).await? > 0)
    }

    /// [`Db::volume_exists`] through [`Db::quick`], for a session create's path.
    pub async fn volume_exists_quick(&self, tenant: &str, name: &str) -> Result<bool, ApiError> {
        let (t, n) = (tenant.to_string(), name.to_string());
        Ok(self.quick(move |conn| count_volume(conn, &t, &n)).await? > 0)
    }

    /// Inserts the volume's row unless it has one; returns whether it was inserted
    /// and the capacity now recorded, read in the same transaction so a concurrent
    /// create cannot slip between them.
    pub async fn ensure_volume(
        &self,
        tenant: &str,
        name: &str,
        created_at: String,
        capacity: u64,
    ) -> Result<(bool, u64), ApiError> {
        let row = (tenant.to_string(), name.to_string(), created_at);
        self.call(move |conn| {
            let tx = conn.transaction()?;
            let inserted = tx.execute(
                "INSERT OR IGNORE INTO volumes (tenant, name, created_at, size_bytes, capacity_bytes)
                 VALUES (?1, ?2, ?3, 0, ?4)",
                params![row.0, row.1, row.2, to_sql_int(capacity)],
            )?;
            let stored: i64 = tx.query_row(
                "SELECT capacity_bytes FROM volumes WHERE tenant = ?1 AND name = ?2",
                params![row.0, row.1],
                |r| r.get(0),
            )?;
            tx.commit()?;
            Ok((inserted == 1, from_sql_int(stored)))
        })
        .await
    }

    /// The recorded capacity of a tenant's volume; `None` if there is no such volume.
    pub async fn volume_capacity(&self, tenant: &str, name: &str) -> Result<Option<u64>, ApiError> {
        let (tenant, name) = (tenant.to_string(), name.to_string());
        let stored = self
            .call(move |conn| {
                conn.query_row(
                    "SELECT capacity_bytes FROM volumes WHERE tenant = ?1 AND name = ?2",
                    params![tenant, name],
                    |row| row.get::<_, i64>(0),
                )
                .optional()
            })
            .await?;
        Ok(stored.map(from_sql_int))
    }

    pub async fn set_volume_capacity(
        &self,
        tenant: &str,
        name: &str,
        capacity: u64,
    ) -> Result<(), ApiError> {
        let (tenant, name) = (tenant.to_string(), name.to_string());
        self.call(move |conn| {
            conn.execute(
                "UPDATE volumes SET capacity_bytes = ?3 WHERE tenant = ?1 AND name = ?2",
                params![tenant, name, to_sql_int(capacity)],
            )
        })
        .await?;
        Ok(())
    }

    pub async fn delete_volume(&self, tenant: &str, name: &str) -> Result<(), ApiError> {
        let (tenant, name) = (tenant.to_string(), name.to_string());
        self.call(move |conn| {
            conn.execute(
                "DELETE FROM volumes WHERE tenant = ?1 AND name = ?2",
                params![tenant, name],
            )
        })
        .await?;
        Ok(())
    }

    /// The capacity of a tenant's volumes (part of its disk quota).
    pub async fn volume_capacity_total(&self, tenant: &str) -> Result<u64, ApiError> {
        let tenant = tenant.to_string();
        self.call(move |conn| {
            conn.query_row(
                "SELECT COALESCE(SUM(capacity_bytes), 0) FROM volumes WHERE tenant = ?1",
                [tenant],
                |row| row.get::<_, i64>(0),
            )
        })
        .await
        .map(from_sql_int)
    }

    /// Every volume of every tenant, as (tenant, name).
    pub async fn all_volumes(&self) -> Result<Vec<(String, String)>, ApiError> {
        self.call(|conn| {
            let mut stmt = conn.prepare("SELECT tenant, name FROM volumes")?;
            let rows = stmt
                .query_map([], |row| {
                    Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?))
                })?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(rows)
        })
        .await
    }

    /// Records the bytes an unmounted volume uses, measured now.
    pub async fn record_volume_size(
        &self,
        tenant: &str,
        name: &str,
        used: u64,
    ) -> Result<(), ApiError> {
        let (t, n) = (tenant.to_string(), name.to_string());
        self.call(move |conn| {
            conn.execute(
                "UPDATE volumes SET size_bytes = ?3, measured_at = ?4
                 WHERE tenant = ?1 AND name = ?2",
                params![t, n, to_sql_int(used), now_rfc3339()],
            )
        })
        .await?;
        Ok(())
    }

    /// The tenant's volumes by name; only the one called `only` if given.
    pub async fn volumes(
        &self,
        tenant: &str,
        only: Option<&str>,
    ) -> Result<Vec<VolumeRow>, ApiError> {
        let (t, only) = (tenant.to_string(), only.map(str::to_string));
        self.call(move |conn| {
            let mut stmt = conn.prepare(
                "SELECT name, capacity_bytes, created_at, size_bytes FROM volumes
                 WHERE tenant = ?1 AND (?2 IS NULL OR name = ?2) ORDER BY name",
            )?;
            let rows = stmt
                .query_map(params![t, only], |row| {
                    Ok(VolumeRow {
                        name: row.get(0)?,
                        capacity_bytes: from_sql_int(row.get(1)?),
                        created_at: row.get(2)?,
                        size_bytes: from_sql_int(row.get(3)?),
                    })
                })?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(rows)
        })
        .await
    }
}
