//! The `sessions` table: one row per live session (and per warm pool sandbox), what
//! a restarted daemon reattaches to.

use rusqlite::{params, Connection};

use super::{insert_audit_in, Db, NewAuditEvent};
use crate::fault::Error as ApiError;

/// A session's row, as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRow {
    pub id: String,
    pub tenant: String,
    pub state: String,
    pub image: Option<String>,
    pub snapshot: Option<String>,
    /// Its create request as stored, JSON.
    pub request: String,
    /// Its sandbox, as its backend records it.
    pub runtime: String,
    /// Its backend's kind (`namespaces`).
    pub backend: String,
    pub created_at: String,
    pub expires_at: Option<String>,
    pub idle_timeout_s: Option<i64>,
    pub last_active_at: String,
    /// Its network policy in force, JSON; `None`: started without a way out.
    pub network: Option<String>,
    /// Its secrets with their values, JSON (`secrets::SessionSecret`); `None`: none.
    pub secrets: Option<String>,
}

/// A session's row as a starting daemon reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredSession {
    pub id: String,
    pub tenant: String,
    pub state: String,
    pub request: String,
    pub runtime: Option<String>,
    pub backend: String,
    pub created_at: String,
    pub expires_at: Option<String>,
    pub idle_timeout_s: Option<i64>,
    pub last_active_at: String,
    pub network: Option<String>,
    pub secrets: Option<String>,
}

fn insert_row(conn: &Connection, row: &SessionRow) -> rusqlite::Result<usize> {
    conn.prepare_cached(
        "INSERT INTO sessions (id, tenant, state, image, snapshot, request, runtime,
             created_at, expires_at, idle_timeout_s, last_active_at, backend, network, secrets)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)",
    )?
    .execute(params![
        row.id,
        row.tenant,
        row.state,
        row.image,
        row.snapshot,
        row.request,
        row.runtime,
        row.created_at,
        row.expires_at,
        row.idle_timeout_s,
        row.last_active_at,
        row.backend,
        row.network,
        row.secrets
    ])
}

fn delete_row(conn: &Connection, id: &str) -> rusqlite::Result<usize> {
    conn.prepare_cached("DELETE FROM sessions WHERE id = ?1")?
        .execute([id])
}

/// Removes an ended session's row and its processes' rows: nothing is kept of it
/// but its audit events, so the tables hold live sessions only, however many have
/// come and gone (every start reads them all).
fn forget(conn: &mut Connection, id: &str) -> rusqlite::Result<()> {
    let tx = conn.transaction()?;
    tx.prepare_cached("DELETE FROM processes WHERE session_id = ?1")?
        .execute([id])?;
    delete_row(&tx, id)?;
    tx.commit()
}

impl Db {
    /// Every session row, for a starting daemon.
    pub async fn stored_sessions(&self) -> Result<Vec<StoredSession>, ApiError> {
        self.call(|conn| {
            let mut stmt = conn.prepare(
                "SELECT id, tenant, state, request, runtime, created_at, expires_at,
                        idle_timeout_s, last_active_at, backend, network, secrets
                 FROM sessions",
            )?;
            let rows = stmt
                .query_map([], |row| {
                    Ok(StoredSession {
                        id: row.get(0)?,
                        tenant: row.get(1)?,
                        state: row.get(2)?,
                        request: row.get(3)?,
                        runtime: row.get(4)?,
                        created_at: row.get(5)?,
                        expires_at: row.get(6)?,
                        idle_timeout_s: row.get(7)?,
                        last_active_at: row.get(8)?,
                        backend: row.get(9)?,
                        network: row.get(10)?,
                        secrets: row.get(11)?,
                    })
                })?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(rows)
        })
        .await
    }

    /// See [`forget`].
    pub async fn forget_session(&self, id: &str) -> Result<(), ApiError> {
        let id = id.to_string();
        self.call(move |conn| forget(conn, &id)).await
    }

    /// [`Db::forget_session`] through [`Db::quick`].
    pub async fn forget_session_quick(&self, id: &str) -> Result<(), ApiError> {
        let id = id.to_string();
        self.quick(move |conn| forget(conn, &id)).await
    }

    /// Deletes a session's row alone (a pool sandbox's: it has no processes).
    pub async fn delete_session_row(&self, id: &str) -> Result<(), ApiError> {
        let id = id.to_string();
        self.call(move |conn| conn.execute("DELETE FROM sessions WHERE id = ?1", [id]))
            .await?;
        Ok(())
    }

    /// [`Db::delete_session_row`] through [`Db::quick`].
    pub async fn delete_session_row_quick(&self, id: &str) -> Result<(), ApiError> {
        let id = id.to_string();
        self.quick(move |conn| delete_row(conn, &id)).await?;
        Ok(())
    }

    /// Records a warm pool sandbox, through [`Db::quick`] like the session rows that
    /// replace it: a write from another connection would make that one read the pages
    /// it holds again at the next create.
    pub async fn insert_pooled_session(
        &self,
        id: String,
        image: Option<String>,
        (runtime, backend): (String, &'static str),
        now: String,
    ) -> Result<(), ApiError> {
        self.quick(move |conn| {
            conn.prepare_cached(
                "INSERT INTO sessions (id, tenant, state, image, request, runtime, created_at,
                     last_active_at, backend)
                 VALUES (?1, '', 'pooled', ?2, '{}', ?3, ?4, ?4, ?5)",
            )?
            .execute(params![id, image, runtime, now, backend])
        })
        .await?;
        Ok(())
    }

    /// Writes a new session's row in one transaction with what goes with it: the
    /// removal of the row of the pool sandbox it took (`pool_row`), and its create
    /// event (with its detail as text).
    pub async fn insert_session(
        &self,
        row: SessionRow,
        pool_row: Option<String>,
        event: Option<(NewAuditEvent, String)>,
    ) -> Result<(), ApiError> {
        self.quick(move |conn| {
            let tx = conn.transaction()?;
            if let Some(pool_row) = &pool_row {
                delete_row(&tx, pool_row)?;
            }
            insert_row(&tx, &row)?;
            if let Some((event, detail)) = &event {
                insert_audit_in(&tx, event, detail)?;
            }
            tx.commit()
        })
        .await
    }

    /// Updates the state, sandbox and activity of the session's row, if it still has
    /// one; returns how many rows changed (0: the session was deleted). A row being
    /// deleted stays `deleting` (with the new sandbox, for a restarted daemon to
    /// destroy): never written back as live, and never inserted again once gone,
    /// which would resurrect the session at the next start.
    pub async fn update_session(&self, row: SessionRow) -> Result<usize, ApiError> {
        self.quick(move |conn| {
            conn.prepare_cached(
                "UPDATE sessions
                 SET state = CASE WHEN state = 'deleting' THEN state ELSE ?2 END,
                     runtime = ?3, last_active_at = ?4
                 WHERE id = ?1",
            )?
            .execute(params![row.id, row.state, row.runtime, row.last_active_at])
        })
        .await
    }

    pub async fn mark_session_deleting(&self, id: &str) -> Result<(), ApiError> {
        let id = id.to_string();
        self.quick(move |conn| {
            conn.prepare_cached("UPDATE sessions SET state = 'deleting' WHERE id = ?1")?
                .execute([&id])
        })
        .await?;
        Ok(())
    }

    /// Saves the last activity of sessions, as (id, time), in one transaction.
    pub async fn save_last_active(&self, changed: Vec<(String, String)>) -> Result<(), ApiError> {
        self.call(move |conn| {
            let tx = conn.transaction()?;
            for (id, active) in &changed {
                tx.execute(
                    "UPDATE sessions SET last_active_at = ?2 WHERE id = ?1",
                    params![id, active],
                )?;
            }
            tx.commit()
        })
        .await
    }

    /// Updates a session's terms; returns how many rows changed (0: it was deleted).
    pub async fn update_session_terms(
        &self,
        id: String,
        (expires_at, idle_timeout_s): (Option<String>, Option<i64>),
        request: String,
        network: Option<String>,
    ) -> Result<usize, ApiError> {
        self.quick(move |conn| {
            conn.prepare_cached(
                "UPDATE sessions SET expires_at = ?2, idle_timeout_s = ?3, request = ?4,
                     network = ?5
                 WHERE id = ?1",
            )?
            .execute(params![id, expires_at, idle_timeout_s, request, network])
        })
        .await
    }
}
