//! The `processes` table: the background processes of live sessions, kept while
//! their session lives so a restarted daemon can watch them again.

use rusqlite::params;

use super::{now_rfc3339, to_sql_int, Db};
use crate::fault::Error as ApiError;

/// A process to record as started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewProcessRow {
    pub session_id: String,
    pub id: String,
    pub tenant: String,
    /// Its argv, as JSON.
    pub argv: String,
    pub started_at: String,
    /// The tag of its output files.
    pub output: String,
}

/// A process as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessRow {
    pub id: String,
    /// Its argv, as JSON.
    pub argv: String,
    pub started_at: String,
    pub ended_at: Option<String>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    /// The tag of its output files.
    pub output: Option<String>,
}

impl Db {
    pub async fn insert_process(&self, row: NewProcessRow) -> Result<(), ApiError> {
        self.call(move |conn| {
            conn.execute(
                "INSERT OR REPLACE INTO processes (session_id, id, tenant, argv, started_at, output)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![
                    row.session_id,
                    row.id,
                    row.tenant,
                    row.argv,
                    row.started_at,
                    row.output
                ],
            )
        })
        .await?;
        Ok(())
    }

    /// The highest process id the session has used; 0 if none.
    pub async fn highest_process_id(&self, session_id: &str) -> Result<u64, ApiError> {
        let id = session_id.to_string();
        let highest = self
            .call(move |conn| {
                conn.query_row(
                    "SELECT COALESCE(MAX(CAST(id AS INTEGER)), 0) FROM processes WHERE session_id = ?1",
                    params![id],
                    |row| row.get::<_, i64>(0),
                )
            })
            .await?;
        Ok(u64::try_from(highest).unwrap_or(0))
    }

    /// Ends, as killed by `signal` now, the session's running processes numbered up
    /// to `base`.
    pub async fn end_processes_through(
        &self,
        session_id: &str,
        base: u64,
        signal: Option<i32>,
    ) -> Result<(), ApiError> {
        let id = session_id.to_string();
        self.call(move |conn| {
            conn.execute(
                "UPDATE processes SET ended_at = ?3, exit_code = NULL, signal = ?4
                 WHERE session_id = ?1 AND ended_at IS NULL AND CAST(id AS INTEGER) <= ?2",
                params![id, to_sql_int(base), now_rfc3339(), signal],
            )
        })
        .await?;
        Ok(())
    }

    /// Ends a running process now, with its exit status.
    pub async fn end_process(
        &self,
        session_id: &str,
        id: &str,
        code: Option<i32>,
        signal: Option<i32>,
    ) -> Result<(), ApiError> {
        let row = (session_id.to_string(), id.to_string());
        self.call(move |conn| {
            conn.execute(
                "UPDATE processes SET ended_at = ?3, exit_code = ?4, signal = ?5
                 WHERE session_id = ?1 AND id = ?2 AND ended_at IS NULL",
                params![row.0, row.1, now_rfc3339(), code, signal],
            )
        })
        .await?;
        Ok(())
    }

    /// The ids of the session's processes not ended.
    pub async fn running_process_ids(&self, session_id: &str) -> Result<Vec<String>, ApiError> {
        let id = session_id.to_string();
        self.call(move |conn| {
            let mut stmt = conn
                .prepare("SELECT id FROM processes WHERE session_id = ?1 AND ended_at IS NULL")?;
            let rows = stmt
                .query_map(params![id], |row| row.get::<_, String>(0))?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(rows)
        })
        .await
    }

    /// The session's processes in the order they started; only `job` if given.
    pub async fn processes(
        &self,
        session_id: &str,
        job: Option<u64>,
    ) -> Result<Vec<ProcessRow>, ApiError> {
        let id = session_id.to_string();
        self.call(move |conn| {
            let mut stmt = conn.prepare(
                "SELECT id, argv, started_at, ended_at, exit_code, signal, output FROM processes
                 WHERE session_id = ?1 AND (?2 IS NULL OR id = ?2) ORDER BY CAST(id AS INTEGER)",
            )?;
            let rows = stmt
                .query_map(params![id, job.map(|j| j.to_string())], |row| {
                    Ok(ProcessRow {
                        id: row.get(0)?,
                        argv: row.get(1)?,
                        started_at: row.get(2)?,
                        ended_at: row.get(3)?,
                        exit_code: row.get(4)?,
                        signal: row.get(5)?,
                        output: row.get(6)?,
                    })
                })?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(rows)
        })
        .await
    }
}
