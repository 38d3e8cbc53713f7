//! The daemon's state in SQLite: tenants, keys, files, sessions, snapshots,
//! processes and the audit log, in `<data-dir>/brig.db`.
//!
//! SQLite runs in WAL mode so readers never block the writer, with
//! `synchronous=NORMAL` (durable across a daemon crash; a power loss may lose the last
//! transactions, never corrupt the file). rusqlite is blocking, so queries run on
//! tokio's blocking pool through [`Db::call`], on one of a few pooled connections;
//! the short statements of the hot paths (a row by key, an audit event) run at once
//! on the caller's thread through [`Db::quick`] instead, unless they would have to
//! wait for another writer.
//!
//! The statements of each concern live in a submodule of their own (sessions,
//! processes, snapshots, volumes), as `impl Db` blocks, and `Db` is the engine's
//! [`crate::catalog::Catalog`] through them (`catalog.rs`). Nothing outside this
//! module writes SQL or sees a connection: [`Db::call`] and [`Db::quick`] are
//! private to it.
//!
//! Times are stored as RFC 3339 UTC strings of fixed width (millisecond precision,
//! `Z`), so comparing the strings compares the times.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::Context;
use rusqlite::config::DbConfig;
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use time::{OffsetDateTime, UtcOffset};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

// The domain error; the front ends decide how it is answered.
use crate::fault::Error as ApiError;

mod catalog;
mod processes;
mod sessions;
mod snapshots;
mod volumes;

pub use processes::{NewProcessRow, ProcessRow};
pub use sessions::{SessionRow, StoredSession};
pub use snapshots::StoredSnapshot;
pub use volumes::VolumeRow;

/// Connections in the pool. WAL allows concurrent readers next to one writer; writers
/// queue on SQLite's lock (up to `BUSY_TIMEOUT`).
const POOL_SIZE: usize = 4;
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the WAL is checkpointed when [`Db::quick`] has written to it (that
/// connection never checkpoints by itself, see [`Db::spawn_checkpoints`]) ...
const CHECKPOINT_INTERVAL: Duration = Duration::from_secs(1);
/// ... or after this many of its writes, whichever comes first: an audit event or a
/// session row is a handful of pages, so this is about the 1000 pages at which
/// SQLite checkpoints by itself.
const CHECKPOINT_WRITES: u64 = 128;
/// WAL frames (4 KiB pages) past which a checkpoint also waits for the writers and
/// has the WAL start over. Under sustained writes a passive checkpoint never sees
/// every frame copied at the start of a write, which is when SQLite rewinds the WAL,
/// so the file would grow without bound.
const WAL_RESTART_FRAMES: i64 = 4 << 10;
/// How much of the database each connection reads through a memory map (address
/// space, not memory: pages come in as they are read). Pages past it are read as
/// without a map.
const MMAP_BYTES: i64 = 1 << 30;

/// The schema, one entry per version (`PRAGMA user_version` counts the entries
/// applied). Never edit an entry once released: append a new one.
const MIGRATIONS: &[&str] = &[
    // 1: the initial schema.
    r#"
    CREATE TABLE tenants (
        name TEXT PRIMARY KEY,
        created_at TEXT,
        max_sessions INTEGER NULL,
        max_concurrent_execs INTEGER NULL,
        max_disk_bytes INTEGER NULL
    );
    CREATE TABLE keys (
        id TEXT PRIMARY KEY,
        tenant TEXT REFERENCES tenants(name),
        name TEXT,
        hash TEXT UNIQUE,
        created_at TEXT,
        revoked_at TEXT NULL
    );
    CREATE INDEX keys_tenant ON keys(tenant);
    CREATE TABLE files (
        id TEXT PRIMARY KEY,
        tenant TEXT,
        filename TEXT,
        size_bytes INTEGER,
        sha256 TEXT,
        created_at TEXT,
        expires_at TEXT
    );
    CREATE INDEX files_tenant ON files(tenant);
    CREATE INDEX files_expires_at ON files(expires_at);
    CREATE TABLE sessions (
        id TEXT PRIMARY KEY,
        tenant TEXT,
        state TEXT,
        image TEXT NULL,
        snapshot TEXT NULL,
        request TEXT,
        runtime TEXT NULL,
        created_at TEXT,
        expires_at TEXT NULL,
        idle_timeout_s INTEGER NULL,
        last_active_at TEXT,
        deleted_at TEXT NULL
    );
    CREATE INDEX sessions_tenant ON sessions(tenant);
    CREATE TABLE snapshots (
        id TEXT PRIMARY KEY,
        tenant TEXT,
        name TEXT NULL,
        session_id TEXT,
        image TEXT,
        created_at TEXT,
        size_bytes INTEGER
    );
    CREATE INDEX snapshots_tenant ON snapshots(tenant);
    CREATE TABLE processes (
        session_id TEXT,
        id TEXT,
        tenant TEXT,
        argv TEXT,
        started_at TEXT,
        ended_at TEXT NULL,
        exit_code INTEGER NULL,
        signal INTEGER NULL,
        PRIMARY KEY(session_id, id)
    );
    CREATE TABLE audit (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        time TEXT,
        tenant TEXT,
        key_id TEXT NULL,
        session_id TEXT NULL,
        action TEXT,
        detail TEXT,
        outcome TEXT
    );
    CREATE INDEX audit_tenant ON audit(tenant, id);
    CREATE INDEX audit_session ON audit(session_id);
    CREATE INDEX audit_action ON audit(action);
    "#,
    // 2: where a background process's output files are (inside its sandbox).
    r#"
    ALTER TABLE processes ADD COLUMN output TEXT NULL;
    "#,
    // 3: per-tenant volumes (directories under <data-dir>/volumes), and the bundle
    // mounts of the session a snapshot was taken from (inherited by its forks).
    r#"
    CREATE TABLE volumes (
        tenant TEXT,
        name TEXT,
        created_at TEXT,
        size_bytes INTEGER DEFAULT 0,
        measured_at TEXT NULL,
        PRIMARY KEY(tenant, name)
    );
    ALTER TABLE snapshots ADD COLUMN mounts TEXT NULL;
    "#,
    // 4: a volume is an ext4 image of a fixed capacity (what the quota counts); 0
    // marks one made before, a plain directory without a cap.
    r#"
    ALTER TABLE volumes ADD COLUMN capacity_bytes INTEGER NOT NULL DEFAULT 0;
    "#,
    // 5: the layers each snapshot holds in the image store beyond the operator's
    // images, with their file sizes: what the tenant's disk quota counts for its
    // snapshots (each layer once, however many of its snapshots hold it). A snapshot
    // made before counts the size recorded for it, under a digest of its own.
    r#"
    CREATE TABLE snapshot_layers (
        snapshot_id TEXT,
        tenant TEXT,
        digest TEXT,
        size_bytes INTEGER,
        PRIMARY KEY(snapshot_id, digest)
    );
    CREATE INDEX snapshot_layers_tenant ON snapshot_layers(tenant, digest);
    INSERT INTO snapshot_layers (snapshot_id, tenant, digest, size_bytes)
        SELECT id, tenant, 'snapshot:' || id, size_bytes FROM snapshots WHERE size_bytes > 0;
    "#,
    // 6: an ended session leaves no row, nor do its background processes (its
    // history is in the audit log): the rows kept of every session ever deleted
    // only slowed each start, which reads them all.
    r#"
    DELETE FROM sessions WHERE deleted_at IS NOT NULL;
    DELETE FROM processes WHERE session_id NOT IN (SELECT id FROM sessions);
    ALTER TABLE sessions DROP COLUMN deleted_at;
    "#,
    // 7: audit retention removes the oldest events by time, not by id: events
    // written while the clock ran ahead would otherwise sit at the head of the id
    // order and stop every batch until their time came.
    r#"
    CREATE INDEX audit_time ON audit(time);
    "#,
    // 8: the snapshot images (`snap-<hex>` in the image store) this daemon is
    // making or removing: one packed but not yet recorded, or whose row is deleted
    // but not yet its image, when the daemon dies is removed at the next start. The
    // store may be shared, so only images listed here are ever taken for orphans.
    r#"
    CREATE TABLE snapshot_images (
        image TEXT PRIMARY KEY,
        since TEXT
    );
    "#,
    // 9: the disk a bundle's extracted copy takes (`<id>.bundle`, made on its first
    // mount and kept as long as the file), which the tenant's quota counts with the
    // file: 0 until then.
    r#"
    ALTER TABLE files ADD COLUMN bundle_bytes INTEGER NOT NULL DEFAULT 0;
    "#,
    // 10: the front end each event came through (`rest`, `onyx`, `e2b`, `mcp`, or
    // `daemon` for what the daemon did on its own). Older events came through REST
    // or onyx, which were not told apart; they read as `rest`.
    r#"
    ALTER TABLE audit ADD COLUMN frontend TEXT NOT NULL DEFAULT 'rest';
    "#,
    // 11: the kind of sandbox each session runs in (`backend::Backend::kind`), so a
    // later kind is a new value rather than a migration. Every older row's sandbox
    // was started with namespaces.
    r#"
    ALTER TABLE sessions ADD COLUMN backend TEXT NOT NULL DEFAULT 'namespaces';
    "#,
    // 12: egress (JSON of `egress::Network`). A session's network policy in force
    // (NULL: started without a way out), a tenant's upper bound on its sessions'
    // policies (NULL: no bound), and the policy of the session a snapshot was taken
    // from, which its forks keep (NULL: none).
    r#"
    ALTER TABLE sessions ADD COLUMN network TEXT NULL;
    ALTER TABLE tenants ADD COLUMN network_bound TEXT NULL;
    ALTER TABLE snapshots ADD COLUMN network TEXT NULL;
    "#,
    // 13: a session's secrets with their values (JSON of `secrets::SessionSecret`;
    // NULL: none), so a restarted daemon serves them again. Only here: this file
    // is 0600 in the 0700 data dir.
    r#"
    ALTER TABLE sessions ADD COLUMN secrets TEXT NULL;
    "#,
];

/// Inserts a stored file's row (a cached statement: a batch inserts thousands).
fn insert_file(conn: &rusqlite::Connection, file: &FileRow) -> rusqlite::Result<usize> {
    conn.prepare_cached(
        "INSERT INTO files (id, tenant, filename, size_bytes, sha256, created_at, expires_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?
    .execute(params![
        file.id,
        file.tenant,
        file.filename,
        to_sql_int(file.size_bytes),
        file.sha256,
        file.created_at,
        file.expires_at
    ])
}

/// Bytes a tenant keeps on disk outside its sessions (`?1` is the tenant): its
/// stored files (with their bundles' extracted copies), its volumes' capacity and
/// the layers its snapshots hold, each layer once (one a fork's snapshot builds on
/// is held by both snapshots).
const STORED_BYTES: &str = "
    SELECT (SELECT COALESCE(SUM(MAX(1, (size_bytes + 4095) / 4096) * 4096 + bundle_bytes), 0)
            FROM files WHERE tenant = ?1)
         + (SELECT COALESCE(SUM(capacity_bytes), 0) FROM volumes WHERE tenant = ?1)
         + (SELECT COALESCE(SUM(size_bytes), 0) FROM (
               SELECT MAX(size_bytes) AS size_bytes FROM snapshot_layers
               WHERE tenant = ?1 GROUP BY digest))";

/// The disk quota counts a stored file as the 4 KiB blocks it takes, and at least
/// one: what it costs the host's disk (and its inodes), so that many small or empty
/// files are not free. [`STORED_BYTES`] and [`Db::file_bytes`] count the same in SQL.
pub fn charged_file_bytes(size: u64) -> u64 {
    size.div_ceil(4096).max(1).saturating_mul(4096)
}

/// Removes up to `?2` of the audit events older than `?1`, the oldest first.
const PRUNE_AUDIT: &str = "
    DELETE FROM audit WHERE id IN
        (SELECT id FROM audit WHERE time < ?1 ORDER BY time LIMIT ?2)";

/// The snapshot part of [`STORED_BYTES`].
const SNAPSHOT_BYTES: &str = "
    SELECT COALESCE(SUM(size_bytes), 0) FROM (
        SELECT MAX(size_bytes) AS size_bytes FROM snapshot_layers
        WHERE tenant = ?1 GROUP BY digest)";

// ---------------------------------------------------------------------------------
// Time

/// Formats a time as RFC 3339 in UTC with exactly three fractional digits
/// (`2025-01-02T03:04:05.678Z`): fixed width, so string order is time order.
pub fn rfc3339(t: OffsetDateTime) -> String {
    let t = t.to_offset(UtcOffset::UTC);
    // Years outside 0..=9999 would break the fixed width; they cannot occur from a
    // clock or a validated input, but clamp rather than misorder.
    let year = t.year().clamp(0, 9999);
    format!(
        "{year:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        t.millisecond()
    )
}

/// Now, as stored in the database.
pub fn now_rfc3339() -> String {
    rfc3339(OffsetDateTime::now_utc())
}

/// Now plus `after`, as stored in the database (saturating far in the future).
pub fn rfc3339_after(after: Duration) -> String {
    rfc3339_from_now(i128::try_from(after.as_nanos()).unwrap_or(i128::MAX))
}

/// Now minus `before`, as stored in the database (saturating at the year 0).
pub fn rfc3339_before(before: Duration) -> String {
    rfc3339_from_now(-i128::try_from(before.as_nanos()).unwrap_or(i128::MAX))
}

/// Now shifted by `nanos`, held within the years the stored form can order.
fn rfc3339_from_now(nanos: i128) -> String {
    let then = OffsetDateTime::now_utc()
        .unix_timestamp_nanos()
        .saturating_add(nanos);
    match OffsetDateTime::from_unix_timestamp_nanos(then) {
        Ok(t) if (0..=9999).contains(&t.year()) => rfc3339(t),
        _ if nanos > 0 => "9999-12-31T23:59:59.999Z".to_string(),
        _ => "0000-01-01T00:00:00.000Z".to_string(),
    }
}

/// Parses any RFC 3339 time (any offset, any precision) and normalizes it to the
/// stored form; `None` if it is not RFC 3339.
pub fn parse_rfc3339(text: &str) -> Option<String> {
    let t =
        OffsetDateTime::parse(text.trim(), &time::format_description::well_known::Rfc3339).ok()?;
    let year = t.to_offset(UtcOffset::UTC).year();
    (0..=9999).contains(&year).then(|| rfc3339(t))
}

// ---------------------------------------------------------------------------------
// The pool

/// A handle to the database; cheap to clone.
#[derive(Clone)]
pub struct Db {
    pool: Arc<Pool>,
}

struct Pool {
    idle: Mutex<Vec<Connection>>,
    /// One permit per connection: a holder of a permit always finds an idle one.
    permits: Arc<Semaphore>,
    path: PathBuf,
    /// The connection of [`Db::quick`]: never waits for a lock (busy timeout 0) and
    /// never checkpoints, so holding this mutex is only ever as long as a statement.
    quick: Mutex<Connection>,
    /// Writes through `quick` since the last checkpoint.
    quick_commits: AtomicU64,
    /// Wakes the checkpointer after [`CHECKPOINT_WRITES`] of them.
    checkpoint_due: tokio::sync::Notify,
}

/// A connection taken from the pool; goes back on drop, even if the closure using it
/// panicked (rusqlite rolls back an unfinished transaction when it is dropped).
struct Lease {
    pool: Arc<Pool>,
    conn: Option<Connection>,
    _permit: OwnedSemaphorePermit,
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            self.pool
                .idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(conn);
        }
    }
}

fn open_connection(path: &Path) -> rusqlite::Result<Connection> {
    let mut conn = Connection::open(path)?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    // The kernel may drop a page-cache page that no process maps long before memory
    // is short: proactive reclaim (DAMON, as on this VM) pages out whole physical
    // regions it samples as cold, hot pages of ours among them. A read of such a page
    // of the database, or a WAL write over part of one (the kernel reads the rest
    // first), then waits for the disk: ~100 us each here, and 6 to 54 of them per
    // pooled create and first exec of a daemon up for minutes. Mapped pages are not reclaimed that way, and reads
    // through the map keep the database's pages mapped; a WAL cut back once
    // checkpointed is only ever appended to, so its writes read nothing.
    conn.pragma_update(None, "mmap_size", MMAP_BYTES)?;
    conn.pragma_update(None, "journal_size_limit", 0)?;
    // Without the query planner stability guarantee, SQLite marks a statement whose
    // plan might depend on a bound value (a parameter used twice, as in the tenant
    // sums) to be compiled again at every new binding: 100-200 us of parsing and
    // planning per create here, for plans that never change (no ANALYZE statistics).
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
    // A DEFERRED transaction that reads and then writes fails at once with
    // SQLITE_BUSY if another connection wrote in between (the busy timeout does not
    // apply to that case); IMMEDIATE takes the write lock up front and waits instead.
    conn.set_transaction_behavior(TransactionBehavior::Immediate);
    Ok(conn)
}

/// Makes the database file at `path` (created if missing) readable by its owner
/// only: it holds sessions' secrets, and SQLite gives its WAL and shared-memory
/// files the database's mode. The data dir is 0700 already; this holds even for a
/// copy of the file moved elsewhere with its mode.
fn private_file(path: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot open the database {}", path.display()))?;
    let mode = file.metadata()?.permissions().mode();
    if mode & 0o077 != 0 {
        file.set_permissions(std::fs::Permissions::from_mode(0o600))
            .with_context(|| format!("cannot make {} private (0600)", path.display()))?;
    }
    for suffix in ["-wal", "-shm"] {
        let mut side = path.as_os_str().to_owned();
        side.push(suffix);
        if let Ok(meta) = std::fs::metadata(&side) {
            if meta.permissions().mode() & 0o077 != 0 {
                std::fs::set_permissions(&side, std::fs::Permissions::from_mode(0o600))?;
            }
        }
    }
    Ok(())
}

fn migrate(conn: &mut Connection) -> anyhow::Result<()> {
    let version: i64 = conn.pragma_query_value(None, "user_version", |row| row.get(0))?;
    let known = MIGRATIONS.len() as i64;
    if version < 0 {
        anyhow::bail!("the database has an invalid schema version {version}");
    }
    if version > known {
        anyhow::bail!(
            "the database schema is version {version}, newer than this brig knows ({known}); \
             use a newer brig"
        );
    }
    for (index, sql) in MIGRATIONS.iter().enumerate().skip(version as usize) {
        let tx = conn.transaction()?;
        tx.execute_batch(sql)
            .with_context(|| format!("database migration {}", index + 1))?;
        tx.pragma_update(None, "user_version", (index + 1) as i64)?;
        tx.commit()?;
    }
    Ok(())
}

impl Db {
    /// Opens (creating if needed) the database at `path` and brings its schema up to
    /// date. Blocking; called once at startup.
    pub fn open(path: &Path) -> anyhow::Result<Db> {
        private_file(path)?;
        let mut first = open_connection(path)
            .with_context(|| format!("cannot open the database {}", path.display()))?;
        migrate(&mut first)
            .with_context(|| format!("cannot migrate the database {}", path.display()))?;
        let mut idle = vec![first];
        for _ in 1..POOL_SIZE {
            idle.push(
                open_connection(path)
                    .with_context(|| format!("cannot open the database {}", path.display()))?,
            );
        }
        let quick = open_connection(path)
            .and_then(|conn| {
                conn.busy_timeout(Duration::ZERO)?;
                conn.pragma_update(None, "wal_autocheckpoint", 0)?;
                Ok(conn)
            })
            .with_context(|| format!("cannot open the database {}", path.display()))?;
        Ok(Db {
            pool: Arc::new(Pool {
                idle: Mutex::new(idle),
                permits: Arc::new(Semaphore::new(POOL_SIZE)),
                path: path.to_path_buf(),
                quick: Mutex::new(quick),
                quick_commits: AtomicU64::new(0),
                checkpoint_due: tokio::sync::Notify::new(),
            }),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.pool.path
    }

    /// Runs `f` with a connection on the blocking pool. A database error becomes a
    /// logged 500 `internal`. Use `conn.transaction()` for several statements that must
    /// apply together (transactions are IMMEDIATE: they wait for the write lock).
    async fn call<R, F>(&self, f: F) -> Result<R, ApiError>
    where
        R: Send + 'static,
        F: FnOnce(&mut Connection) -> rusqlite::Result<R> + Send + 'static,
    {
        self.try_call(move |conn| f(conn).map_err(ApiError::from))
            .await
    }

    /// Like [`Db::call`], for closures that decide on an API error themselves (e.g. 409
    /// or 429 inside a transaction); `?` on a rusqlite error still gives a 500.
    async fn try_call<R, F>(&self, f: F) -> Result<R, ApiError>
    where
        R: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<R, ApiError> + Send + 'static,
    {
        let permit = self
            .pool
            .permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| ApiError::unavailable("the database is closed"))?;
        let conn = self
            .pool
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        let Some(conn) = conn else {
            return Err(ApiError::internal(
                "database pool: a permit without a connection",
            ));
        };
        let mut lease = Lease {
            pool: self.pool.clone(),
            conn: Some(conn),
            _permit: permit,
        };
        tokio::task::spawn_blocking(move || match lease.conn.as_mut() {
            Some(conn) => f(conn),
            None => Err(ApiError::internal(
                "database pool: lease without a connection",
            )),
        })
        .await
        .map_err(|e| ApiError::internal(format_args!("database task failed: {e}")))?
    }

    /// Runs `f` at once on the calling thread, for the short statements of the hot
    /// paths (a row by key, an audit event): a hop to the blocking pool costs two
    /// thread wake-ups, several times the statements themselves. It blocks the async
    /// worker only while SQLite works: its connection never waits for a lock, and when
    /// another connection holds the write lock (SQLITE_BUSY) `f` runs again through
    /// [`Db::call`], which waits. So `f` may run twice: it must touch nothing but the
    /// database (a failed attempt is rolled back), and a transaction in it should be
    /// begun before anything is read (transactions are IMMEDIATE, so BUSY comes at
    /// their start). Durability is the same as [`Db::call`]'s: committed (in the WAL)
    /// when this returns.
    async fn quick<R, F>(&self, f: F) -> Result<R, ApiError>
    where
        R: Send + 'static,
        F: Fn(&mut Connection) -> rusqlite::Result<R> + Send + 'static,
    {
        let first = {
            let mut conn = self
                .pool
                .quick
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let changes = conn.total_changes();
            let result = f(&mut conn);
            if conn.total_changes() != changes
                && self.pool.quick_commits.fetch_add(1, Ordering::Relaxed) + 1 == CHECKPOINT_WRITES
            {
                self.pool.checkpoint_due.notify_one();
            }
            result
        };
        match first {
            Err(e) if e.sqlite_error_code() == Some(rusqlite::ErrorCode::DatabaseBusy) => {
                self.call(move |conn| f(conn)).await
            }
            other => other.map_err(ApiError::from),
        }
    }

    /// Checkpoints the WAL after [`Db::quick`] wrote to it ([`CHECKPOINT_WRITES`]
    /// times, or at all within [`CHECKPOINT_INTERVAL`]), on the blocking pool: a
    /// checkpoint syncs the files (the one disk flush that WAL with
    /// `synchronous=NORMAL` does), which must not happen on an async worker in the
    /// middle of a request. The pooled connections still checkpoint by themselves
    /// (at 1000 WAL pages), as before.
    pub fn spawn_checkpoints(&self) {
        let db = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(CHECKPOINT_INTERVAL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    () = db.pool.checkpoint_due.notified() => {}
                }
                if db.pool.quick_commits.swap(0, Ordering::Relaxed) == 0 {
                    continue;
                }
                if let Err(e) = db.call(checkpoint).await {
                    tracing::warn!("cannot checkpoint the database: {}", e.message);
                }
            }
        });
    }

    // -----------------------------------------------------------------------------
    // Tenants

    /// Creates the tenant if it does not exist; true if it was created.
    pub async fn ensure_tenant(&self, name: &str) -> Result<bool, ApiError> {
        let name = name.to_string();
        self.call(move |conn| {
            let n = conn.execute(
                "INSERT OR IGNORE INTO tenants (name, created_at) VALUES (?1, ?2)",
                params![name, now_rfc3339()],
            )?;
            Ok(n == 1)
        })
        .await
    }

    pub async fn tenant(&self, name: &str) -> Result<Option<TenantRow>, ApiError> {
        let name = name.to_string();
        self.call(move |conn| {
            conn.query_row(
                &format!("SELECT {TENANT_COLUMNS} FROM tenants WHERE name = ?1"),
                [name],
                TenantRow::from_row,
            )
            .optional()
        })
        .await
    }

    pub async fn tenants(&self) -> Result<Vec<TenantRow>, ApiError> {
        self.call(|conn| {
            let mut stmt = conn.prepare(&format!(
                "SELECT {TENANT_COLUMNS} FROM tenants ORDER BY name"
            ))?;
            let rows = stmt.query_map([], TenantRow::from_row)?;
            rows.collect()
        })
        .await
    }

    /// Applies a quota update to an existing tenant; `None` if there is no such tenant.
    pub async fn update_tenant_quotas(
        &self,
        name: &str,
        update: QuotaUpdate,
    ) -> Result<Option<TenantRow>, ApiError> {
        let name = name.to_string();
        self.call(move |conn| {
            let tx = conn.transaction()?;
            let Some(mut row) = tx
                .query_row(
                    &format!("SELECT {TENANT_COLUMNS} FROM tenants WHERE name = ?1"),
                    [&name],
                    TenantRow::from_row,
                )
                .optional()?
            else {
                return Ok(None);
            };
            if let Some(v) = update.max_sessions {
                row.max_sessions = v;
            }
            if let Some(v) = update.max_concurrent_execs {
                row.max_concurrent_execs = v;
            }
            if let Some(v) = update.max_disk_bytes {
                row.max_disk_bytes = v;
            }
            if let Some(v) = update.network_bound {
                row.network_bound = v;
            }
            tx.execute(
                "UPDATE tenants SET max_sessions = ?2, max_concurrent_execs = ?3, \
                 max_disk_bytes = ?4, network_bound = ?5 WHERE name = ?1",
                params![
                    name,
                    row.max_sessions.map(to_sql_int),
                    row.max_concurrent_execs.map(to_sql_int),
                    row.max_disk_bytes.map(to_sql_int),
                    row.network_bound
                ],
            )?;
            tx.commit()?;
            Ok(Some(row))
        })
        .await
    }

    /// Live sessions of a tenant (an ended session has no row).
    pub async fn live_session_count(&self, tenant: &str) -> Result<u64, ApiError> {
        let tenant = tenant.to_string();
        self.call(move |conn| {
            conn.query_row(
                "SELECT COUNT(*) FROM sessions WHERE tenant = ?1",
                [tenant],
                |row| row.get::<_, i64>(0),
            )
        })
        .await
        .map(from_sql_int)
    }

    // -----------------------------------------------------------------------------
    // Keys

    /// Stores a new key (by hash), creating its tenant if new; false (and nothing
    /// stored) if the key id is taken.
    pub async fn insert_key(&self, key: KeyRow, hash: String) -> Result<bool, ApiError> {
        self.call(move |conn| {
            let tx = conn.transaction()?;
            let taken: bool = tx.query_row(
                "SELECT EXISTS (SELECT 1 FROM keys WHERE id = ?1)",
                [&key.id],
                |row| row.get(0),
            )?;
            if taken {
                return Ok(false);
            }
            tx.execute(
                "INSERT OR IGNORE INTO tenants (name, created_at) VALUES (?1, ?2)",
                params![key.tenant, key.created_at],
            )?;
            tx.execute(
                "INSERT INTO keys (id, tenant, name, hash, created_at, revoked_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![
                    key.id,
                    key.tenant,
                    key.name,
                    hash,
                    key.created_at,
                    key.revoked_at
                ],
            )?;
            tx.commit()?;
            Ok(true)
        })
        .await
    }

    /// The live (not revoked) key with this hash.
    pub async fn key_by_hash(&self, hash: &str) -> Result<Option<KeyRow>, ApiError> {
        let hash = hash.to_string();
        self.call(move |conn| {
            conn.query_row(
                &format!("SELECT {KEY_COLUMNS} FROM keys WHERE hash = ?1 AND revoked_at IS NULL"),
                [hash],
                KeyRow::from_row,
            )
            .optional()
        })
        .await
    }

    pub async fn key(&self, id: &str) -> Result<Option<KeyRow>, ApiError> {
        let id = id.to_string();
        self.call(move |conn| {
            conn.query_row(
                &format!("SELECT {KEY_COLUMNS} FROM keys WHERE id = ?1"),
                [id],
                KeyRow::from_row,
            )
            .optional()
        })
        .await
    }

    /// Keys of one tenant, or of all tenants with `None`, in creation order.
    pub async fn keys(&self, tenant: Option<&str>) -> Result<Vec<KeyRow>, ApiError> {
        let tenant = tenant.map(str::to_string);
        self.call(move |conn| {
            let mut stmt = conn.prepare(&format!(
                "SELECT {KEY_COLUMNS} FROM keys WHERE ?1 IS NULL OR tenant = ?1 \
                 ORDER BY rowid"
            ))?;
            let rows = stmt.query_map([tenant], KeyRow::from_row)?;
            rows.collect()
        })
        .await
    }

    /// Marks a key revoked (keeping the first revocation time); the key as it now is,
    /// `None` if unknown.
    pub async fn revoke_key(&self, id: &str) -> Result<Option<KeyRow>, ApiError> {
        let id = id.to_string();
        self.call(move |conn| {
            let tx = conn.transaction()?;
            tx.execute(
                "UPDATE keys SET revoked_at = ?2 WHERE id = ?1 AND revoked_at IS NULL",
                params![id, now_rfc3339()],
            )?;
            let row = tx
                .query_row(
                    &format!("SELECT {KEY_COLUMNS} FROM keys WHERE id = ?1"),
                    [&id],
                    KeyRow::from_row,
                )
                .optional()?;
            tx.commit()?;
            Ok(row)
        })
        .await
    }

    /// Whether the tenant has at least one key that is not revoked.
    pub async fn has_live_key(&self, tenant: &str) -> Result<bool, ApiError> {
        let tenant = tenant.to_string();
        self.call(move |conn| {
            conn.query_row(
                "SELECT EXISTS (SELECT 1 FROM keys WHERE tenant = ?1 AND revoked_at IS NULL)",
                [tenant],
                |row| row.get(0),
            )
        })
        .await
    }

    // -----------------------------------------------------------------------------
    // Files

    /// Records a stored file if what the tenant stores (see [`Db::stored_bytes`])
    /// plus `reserved` other bytes (its sessions' disks) stay within
    /// `max_disk_bytes` (checked and inserted in one transaction, so two concurrent
    /// uploads, or an upload and a snapshot, cannot both slip under the quota): 429
    /// otherwise.
    pub async fn insert_file_within(
        &self,
        file: FileRow,
        reserved: u64,
        max_disk_bytes: u64,
    ) -> Result<(), ApiError> {
        self.try_call(move |conn| {
            let tx = conn.transaction()?;
            let used: i64 = tx.query_row(STORED_BYTES, [&file.tenant], |row| row.get(0))?;
            let total = from_sql_int(used)
                .saturating_add(reserved)
                .saturating_add(charged_file_bytes(file.size_bytes));
            if total > max_disk_bytes {
                return Err(ApiError::quota(format!(
                    "tenant {} would use {total} of its {max_disk_bytes} bytes of disk with \
                     this file (GET /v1/tenants/{} shows what counts)",
                    file.tenant, file.tenant
                )));
            }
            insert_file(&tx, &file)?;
            tx.commit()?;
            Ok(())
        })
        .await
    }

    /// Records the files that fit in the tenant's disk quota, in order, as
    /// [`Db::insert_file_within`] would one by one, in one transaction: the quota
    /// is read once, and a batch of thousands commits (and syncs) once, not once
    /// per file. Returns which were recorded.
    pub async fn insert_files_within(
        &self,
        files: Vec<FileRow>,
        reserved: u64,
        max_disk_bytes: u64,
    ) -> Result<Vec<bool>, ApiError> {
        let Some(tenant) = files.first().map(|f| f.tenant.clone()) else {
            return Ok(Vec::new());
        };
        if files.iter().any(|f| f.tenant != tenant) {
            return Err(ApiError::internal("a batch of files of several tenants"));
        }
        self.try_call(move |conn| {
            let tx = conn.transaction()?;
            let used: i64 = tx.query_row(STORED_BYTES, [&tenant], |row| row.get(0))?;
            let mut total = from_sql_int(used).saturating_add(reserved);
            let mut recorded = Vec::with_capacity(files.len());
            for file in files {
                let after = total.saturating_add(charged_file_bytes(file.size_bytes));
                if after > max_disk_bytes {
                    recorded.push(false);
                    continue;
                }
                insert_file(&tx, &file)?;
                total = after;
                recorded.push(true);
            }
            tx.commit()?;
            Ok(recorded)
        })
        .await
    }

    /// Records that the extracted copy of a tenant's bundle takes `bytes`, if what
    /// the tenant stores with it (see [`Db::stored_bytes`], the copy's earlier
    /// charge replaced) plus `reserved` other bytes (its sessions' disks) stays
    /// within `max_disk_bytes`: 429 otherwise, 404 for a file no longer there.
    pub async fn charge_bundle_within(
        &self,
        tenant: &str,
        id: &str,
        bytes: u64,
        reserved: u64,
        max_disk_bytes: u64,
    ) -> Result<(), ApiError> {
        let (tenant, id) = (tenant.to_string(), id.to_string());
        self.try_call(move |conn| {
            let tx = conn.transaction()?;
            let before: Option<i64> = tx
                .query_row(
                    "SELECT bundle_bytes FROM files WHERE tenant = ?1 AND id = ?2",
                    params![tenant, id],
                    |row| row.get(0),
                )
                .optional()?;
            let Some(before) = before.map(from_sql_int) else {
                return Err(ApiError::not_found(format!("no file {id}")));
            };
            let used: i64 = tx.query_row(STORED_BYTES, [&tenant], |row| row.get(0))?;
            let total = from_sql_int(used)
                .saturating_sub(before)
                .saturating_add(reserved)
                .saturating_add(bytes);
            if bytes > before && total > max_disk_bytes {
                return Err(ApiError::quota(format!(
                    "tenant {tenant} would use {total} of its {max_disk_bytes} bytes of disk \
                     with this bundle extracted (GET /v1/tenants/{tenant} shows what counts)"
                )));
            }
            tx.execute(
                "UPDATE files SET bundle_bytes = ?3 WHERE tenant = ?1 AND id = ?2",
                params![tenant, id, to_sql_int(bytes)],
            )?;
            tx.commit()?;
            Ok(())
        })
        .await
    }

    /// A tenant's file that has not expired.
    pub async fn file(&self, tenant: &str, id: &str) -> Result<Option<FileRow>, ApiError> {
        let (tenant, id) = (tenant.to_string(), id.to_string());
        self.call(move |conn| {
            conn.query_row(
                &format!(
                    "SELECT {FILE_COLUMNS} FROM files \
                     WHERE tenant = ?1 AND id = ?2 AND expires_at > ?3"
                ),
                params![tenant, id, now_rfc3339()],
                FileRow::from_row,
            )
            .optional()
        })
        .await
    }

    /// A tenant's files that have not expired, in upload order.
    pub async fn files(&self, tenant: &str) -> Result<Vec<FileRow>, ApiError> {
        let tenant = tenant.to_string();
        self.call(move |conn| {
            let mut stmt = conn.prepare(&format!(
                "SELECT {FILE_COLUMNS} FROM files WHERE tenant = ?1 AND expires_at > ?2 \
                 ORDER BY rowid"
            ))?;
            let rows = stmt.query_map(params![tenant, now_rfc3339()], FileRow::from_row)?;
            rows.collect()
        })
        .await
    }

    /// Deletes a tenant's file row; the row as it was, `None` if unknown.
    pub async fn delete_file(&self, tenant: &str, id: &str) -> Result<Option<FileRow>, ApiError> {
        let (tenant, id) = (tenant.to_string(), id.to_string());
        self.call(move |conn| {
            let tx = conn.transaction()?;
            let row = tx
                .query_row(
                    &format!("SELECT {FILE_COLUMNS} FROM files WHERE tenant = ?1 AND id = ?2"),
                    params![tenant, id],
                    FileRow::from_row,
                )
                .optional()?;
            if row.is_some() {
                tx.execute(
                    "DELETE FROM files WHERE tenant = ?1 AND id = ?2",
                    params![tenant, id],
                )?;
            }
            tx.commit()?;
            Ok(row)
        })
        .await
    }

    /// Deletes the rows of files expired at `now`, except those in `keep` (mounted by
    /// a live session: they go once unused), and returns them (for their blobs).
    pub async fn take_expired_files(
        &self,
        now: String,
        keep: HashSet<String>,
    ) -> Result<Vec<FileRow>, ApiError> {
        self.call(move |conn| {
            let tx = conn.transaction()?;
            let rows = {
                let mut stmt = tx.prepare(&format!(
                    "SELECT {FILE_COLUMNS} FROM files WHERE expires_at <= ?1"
                ))?;
                let rows = stmt.query_map([&now], FileRow::from_row)?;
                rows.collect::<rusqlite::Result<Vec<_>>>()?
            };
            let rows: Vec<FileRow> = rows.into_iter().filter(|r| !keep.contains(&r.id)).collect();
            for row in &rows {
                tx.execute("DELETE FROM files WHERE id = ?1", [&row.id])?;
            }
            tx.commit()?;
            Ok(rows)
        })
        .await
    }

    /// Disk the tenant's stored files take, as [`charged_file_bytes`] counts it,
    /// with their bundles' extracted copies (expired ones until they are swept).
    pub async fn file_bytes(&self, tenant: &str) -> Result<u64, ApiError> {
        self.tenant_sum(
            "SELECT COALESCE(SUM(MAX(1, (size_bytes + 4095) / 4096) * 4096 + bundle_bytes), 0) \
             FROM files WHERE tenant = ?1",
            tenant,
        )
        .await
    }

    /// Bytes a tenant keeps on disk outside its sessions: its stored files, its
    /// volumes' capacity and its snapshots' layers. One statement on the fast
    /// connection: a create asks for it on every call.
    pub async fn stored_bytes(&self, tenant: &str) -> Result<u64, ApiError> {
        self.tenant_sum(STORED_BYTES, tenant).await
    }

    /// A byte count of one tenant (`?1`), by a cached statement on the fast connection.
    async fn tenant_sum(&self, sql: &'static str, tenant: &str) -> Result<u64, ApiError> {
        let tenant = tenant.to_string();
        self.quick(move |conn| {
            conn.prepare_cached(sql)?
                .query_row([&tenant], |row| row.get::<_, i64>(0))
        })
        .await
        .map(from_sql_int)
    }

    /// Bytes of the layers the tenant's snapshots hold, each layer once.
    pub async fn snapshot_bytes(&self, tenant: &str) -> Result<u64, ApiError> {
        self.tenant_sum(SNAPSHOT_BYTES, tenant).await
    }

    // -----------------------------------------------------------------------------
    // Snapshots

    /// Records a snapshot and the layers it holds if what the tenant stores with
    /// them (see [`Db::stored_bytes`]: a layer it already holds adds nothing) plus
    /// `reserved` other bytes (its sessions' disks) stays within `max_disk_bytes`:
    /// checked and inserted in one transaction, so two concurrent snapshots (or a
    /// snapshot and an upload) cannot both slip under the quota. 429 otherwise, and
    /// nothing is recorded.
    pub async fn insert_snapshot_within(
        &self,
        snapshot: SnapshotRow,
        reserved: u64,
        max_disk_bytes: u64,
    ) -> Result<(), ApiError> {
        self.try_call(move |conn| {
            let tx = conn.transaction()?;
            let before: i64 = tx.query_row(STORED_BYTES, [&snapshot.tenant], |row| row.get(0))?;
            tx.execute(
                "INSERT INTO snapshots (id, tenant, name, session_id, image, created_at, \
                 size_bytes, mounts, network) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                params![
                    snapshot.id,
                    snapshot.tenant,
                    snapshot.name,
                    snapshot.session_id,
                    snapshot.image,
                    snapshot.created_at,
                    to_sql_int(snapshot.size_bytes),
                    snapshot.mounts,
                    snapshot.network
                ],
            )?;
            for (digest, size) in &snapshot.layers {
                tx.execute(
                    "INSERT OR IGNORE INTO snapshot_layers (snapshot_id, tenant, digest, \
                     size_bytes) VALUES (?1, ?2, ?3, ?4)",
                    params![snapshot.id, snapshot.tenant, digest, to_sql_int(*size)],
                )?;
            }
            let after: i64 = tx.query_row(STORED_BYTES, [&snapshot.tenant], |row| row.get(0))?;
            let total = from_sql_int(after).saturating_add(reserved);
            if total > max_disk_bytes {
                // Dropped without a commit: rolled back.
                return Err(ApiError::quota(format!(
                    "tenant {} would use {total} of its {max_disk_bytes} bytes of disk with this \
                     snapshot ({} bytes more); delete snapshots, files, volumes or sessions first",
                    snapshot.tenant,
                    from_sql_int(after).saturating_sub(from_sql_int(before))
                )));
            }
            tx.commit()?;
            Ok(())
        })
        .await
    }

    /// Deletes a tenant's snapshot row and its layers' (freeing them in its quota,
    /// unless another of its snapshots holds them too), and lists its store image
    /// `image` as one to remove (see [`Db::begin_snapshot_image`]); false if there is
    /// no such snapshot.
    pub async fn delete_snapshot(
        &self,
        tenant: &str,
        id: &str,
        image: &str,
    ) -> Result<bool, ApiError> {
        let (tenant, id, image) = (tenant.to_string(), id.to_string(), image.to_string());
        self.call(move |conn| {
            let tx = conn.transaction()?;
            let deleted = tx.execute(
                "DELETE FROM snapshots WHERE id = ?1 AND tenant = ?2",
                params![id, tenant],
            )?;
            if deleted == 0 {
                return Ok(false);
            }
            tx.execute(
                "DELETE FROM snapshot_layers WHERE snapshot_id = ?1 AND tenant = ?2",
                params![id, tenant],
            )?;
            tx.execute(
                "INSERT OR IGNORE INTO snapshot_images (image, since) VALUES (?1, ?2)",
                params![image, now_rfc3339()],
            )?;
            tx.commit()?;
            Ok(true)
        })
        .await
    }

    /// Lists a snapshot image about to be made (or removed) in the store: until
    /// [`Db::end_snapshot_image`], a daemon start removes it unless a snapshot row
    /// names it by then.
    pub async fn begin_snapshot_image(&self, image: &str) -> Result<(), ApiError> {
        let image = image.to_string();
        self.quick(move |conn| {
            conn.prepare_cached(
                "INSERT OR IGNORE INTO snapshot_images (image, since) VALUES (?1, ?2)",
            )?
            .execute(params![image, now_rfc3339()])
        })
        .await
        .map(|_| ())
    }

    /// The image listed by [`Db::begin_snapshot_image`] is recorded or removed.
    pub async fn end_snapshot_image(&self, image: &str) -> Result<(), ApiError> {
        let image = image.to_string();
        self.quick(move |conn| {
            conn.prepare_cached("DELETE FROM snapshot_images WHERE image = ?1")?
                .execute([&image])
        })
        .await
        .map(|_| ())
    }

    /// The listed snapshot images, each with whether a snapshot (`id`, from the
    /// image's name by `id_of`) records it.
    pub async fn snapshot_images(
        &self,
        id_of: fn(&str) -> Option<String>,
    ) -> Result<Vec<(String, bool)>, ApiError> {
        self.call(move |conn| {
            let images = conn
                .prepare("SELECT image FROM snapshot_images")?
                .query_map([], |row| row.get::<_, String>(0))?
                .collect::<Result<Vec<_>, _>>()?;
            let mut found = conn.prepare("SELECT 1 FROM snapshots WHERE id = ?1")?;
            images
                .into_iter()
                .map(|image| {
                    let recorded = match id_of(&image) {
                        Some(id) => found.exists([id])?,
                        None => false,
                    };
                    Ok((image, recorded))
                })
                .collect()
        })
        .await
    }

    /// Every file id known (for the startup sweep of orphaned blobs).
    pub async fn file_ids(&self) -> Result<HashSet<String>, ApiError> {
        self.call(|conn| {
            let mut stmt = conn.prepare("SELECT id FROM files")?;
            let rows = stmt.query_map([], |row| row.get::<_, String>(0))?;
            rows.collect()
        })
        .await
    }

    // -----------------------------------------------------------------------------
    // Audit

    /// Appends an event; returns its id.
    pub async fn insert_audit(&self, event: NewAuditEvent) -> Result<i64, ApiError> {
        let detail = event.detail.to_string();
        self.quick(move |conn| insert_audit_in(conn, &event, &detail))
            .await
    }

    /// Appends events in one transaction.
    pub async fn insert_audits(&self, events: Vec<NewAuditEvent>) -> Result<(), ApiError> {
        let rows: Vec<(NewAuditEvent, String)> = events
            .into_iter()
            .map(|e| {
                let detail = e.detail.to_string();
                (e, detail)
            })
            .collect();
        self.call(move |conn| {
            let tx = conn.transaction()?;
            for (event, detail) in &rows {
                insert_audit_in(&tx, event, detail)?;
            }
            tx.commit()
        })
        .await
    }

    /// The id of the newest audit event; 0 if there is none.
    pub async fn max_audit_id(&self) -> Result<i64, ApiError> {
        self.call(|c| c.query_row("SELECT COALESCE(MAX(id), 0) FROM audit", [], |r| r.get(0)))
            .await
    }

    /// Removes up to `batch` of the events older than `cutoff` (a stored time), the
    /// oldest first; returns how many went. Through the time index it reads no more
    /// than it removes, never the whole table, and holds the write lock only that
    /// long, whatever the order ids and times came in.
    pub async fn prune_audit(&self, cutoff: String, batch: u32) -> Result<usize, ApiError> {
        self.call(move |conn| {
            conn.prepare_cached(PRUNE_AUDIT)?
                .execute(params![cutoff, i64::from(batch)])
        })
        .await
    }

    /// Events matching the filter, in id order.
    pub async fn audit_events(&self, filter: AuditFilter) -> Result<Vec<AuditRow>, ApiError> {
        self.call(move |conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT id, time, tenant, key_id, session_id, action, detail, outcome, frontend \
                 FROM audit WHERE id > ?1 \
                 AND (?2 IS NULL OR tenant = ?2) \
                 AND (?3 IS NULL OR session_id = ?3) \
                 AND (?4 IS NULL OR action = ?4) \
                 AND (?5 IS NULL OR outcome = ?5) \
                 AND (?6 IS NULL OR time >= ?6) \
                 AND (?7 IS NULL OR time < ?7) \
                 AND (?8 IS NULL OR id <= ?8) \
                 ORDER BY id LIMIT ?9",
            )?;
            let rows = stmt.query_map(
                params![
                    filter.after_id.unwrap_or(0),
                    filter.tenant,
                    filter.session_id,
                    filter.action,
                    filter.outcome,
                    filter.since,
                    filter.until,
                    filter.max_id,
                    i64::from(filter.limit)
                ],
                AuditRow::from_row,
            )?;
            rows.collect()
        })
        .await
    }
}

/// A passive checkpoint (it copies what it can without waiting for anyone), then a
/// restarting one if the WAL is past [`WAL_RESTART_FRAMES`] (it waits for the writer,
/// up to the busy timeout, and holds new ones off while it copies the rest: little,
/// after the passive one). Once every frame is copied, the WAL is rewound here too.
fn checkpoint(conn: &mut Connection) -> rusqlite::Result<()> {
    let (mut frames, mut copied): (i64, i64) =
        conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| {
            Ok((row.get(1)?, row.get(2)?))
        })?;
    if frames > WAL_RESTART_FRAMES {
        (frames, copied) = conn.query_row("PRAGMA wal_checkpoint(RESTART)", [], |row| {
            Ok((row.get(1)?, row.get(2)?))
        })?;
    }
    if frames > 0 && copied == frames {
        rewind_wal(conn)?;
    }
    Ok(())
}

/// Writes one frame, so that this connection, off the request path, is the writer
/// that starts the fully copied WAL over. The first frame after a rewind carries a new
/// WAL header, which SQLite syncs to disk even with `synchronous=NORMAL`: left to the
/// next request, that flush (0.4 ms and more here) lands on whichever write comes
/// first after each checkpoint, as often as once a second. The frame rewrites the
/// schema version with its own value: it changes nothing.
fn rewind_wal(conn: &mut Connection) -> rusqlite::Result<()> {
    let tx = conn.transaction()?;
    let version: i64 = tx.pragma_query_value(None, "user_version", |row| row.get(0))?;
    tx.pragma_update(None, "user_version", version)?;
    tx.commit()
}

/// Appends an event on `conn` (in its transaction, if one is open); returns its id.
fn insert_audit_in(
    conn: &Connection,
    event: &NewAuditEvent,
    detail: &str,
) -> rusqlite::Result<i64> {
    conn.prepare_cached(
        "INSERT INTO audit (time, tenant, key_id, session_id, action, detail, outcome, frontend) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )?
    .execute(params![
        event.time,
        event.tenant,
        event.key_id,
        event.session_id,
        event.action,
        detail,
        event.outcome,
        event.frontend
    ])?;
    Ok(conn.last_insert_rowid())
}

/// Database failures are host failures: logged, answered as `internal`.
impl From<rusqlite::Error> for ApiError {
    fn from(err: rusqlite::Error) -> ApiError {
        ApiError::internal(format_args!("database: {err}"))
    }
}

/// SQLite integers are i64; quotas and sizes are u64 below 2^63 in practice, and
/// saturate rather than wrap if ever larger.
fn to_sql_int(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Negative values (never written by brig) read as 0.
fn from_sql_int(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

// ---------------------------------------------------------------------------------
// Rows

const TENANT_COLUMNS: &str =
    "name, created_at, max_sessions, max_concurrent_execs, max_disk_bytes, network_bound";

/// A tenant; `None` quotas fall back to the `brig serve` defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantRow {
    pub name: String,
    pub created_at: String,
    pub max_sessions: Option<u64>,
    pub max_concurrent_execs: Option<u64>,
    pub max_disk_bytes: Option<u64>,
    /// The bound on its sessions' network policies, as JSON (`egress::Network`).
    pub network_bound: Option<String>,
}

impl TenantRow {
    fn from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<TenantRow> {
        Ok(TenantRow {
            name: row.get(0)?,
            created_at: row.get::<_, Option<String>>(1)?.unwrap_or_default(),
            max_sessions: row.get::<_, Option<i64>>(2)?.map(from_sql_int),
            max_concurrent_execs: row.get::<_, Option<i64>>(3)?.map(from_sql_int),
            max_disk_bytes: row.get::<_, Option<i64>>(4)?.map(from_sql_int),
            network_bound: row.get(5)?,
        })
    }
}

/// A change to a tenant's quotas: outer `None` leaves a quota alone, `Some(None)`
/// resets it to the daemon's default, `Some(Some(n))` sets it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QuotaUpdate {
    pub max_sessions: Option<Option<u64>>,
    pub max_concurrent_execs: Option<Option<u64>>,
    pub max_disk_bytes: Option<Option<u64>>,
    /// JSON of an `egress::Network`.
    pub network_bound: Option<Option<String>>,
}

const KEY_COLUMNS: &str = "id, tenant, name, created_at, revoked_at";

/// An API key, without its hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRow {
    pub id: String,
    pub tenant: String,
    pub name: Option<String>,
    pub created_at: String,
    pub revoked_at: Option<String>,
}

impl KeyRow {
    fn from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<KeyRow> {
        Ok(KeyRow {
            id: row.get(0)?,
            tenant: row.get::<_, Option<String>>(1)?.unwrap_or_default(),
            name: row.get(2)?,
            created_at: row.get::<_, Option<String>>(3)?.unwrap_or_default(),
            revoked_at: row.get(4)?,
        })
    }
}

const FILE_COLUMNS: &str = "id, tenant, filename, size_bytes, sha256, created_at, expires_at";

/// An uploaded (or daemon-stored) file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileRow {
    pub id: String,
    pub tenant: String,
    pub filename: String,
    pub size_bytes: u64,
    pub sha256: String,
    pub created_at: String,
    pub expires_at: String,
}

impl FileRow {
    fn from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<FileRow> {
        Ok(FileRow {
            id: row.get(0)?,
            tenant: row.get::<_, Option<String>>(1)?.unwrap_or_default(),
            filename: row.get::<_, Option<String>>(2)?.unwrap_or_default(),
            size_bytes: from_sql_int(row.get::<_, Option<i64>>(3)?.unwrap_or(0)),
            sha256: row.get::<_, Option<String>>(4)?.unwrap_or_default(),
            created_at: row.get::<_, Option<String>>(5)?.unwrap_or_default(),
            expires_at: row.get::<_, Option<String>>(6)?.unwrap_or_default(),
        })
    }
}

/// A snapshot to record: its row of the `snapshots` table and the layers it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotRow {
    pub id: String,
    pub tenant: String,
    pub name: Option<String>,
    pub session_id: String,
    /// The base image; empty for a snapshot of a session on the host's system dirs.
    pub image: String,
    pub created_at: String,
    /// Its new layer's size (what the API shows).
    pub size_bytes: u64,
    /// Its session's bundle mounts, as JSON.
    pub mounts: String,
    /// Its session's network policy, as JSON (`egress::Network`).
    pub network: Option<String>,
    /// The layers of its image beyond the operator's images, by digest, with their
    /// file sizes: what the tenant's disk quota counts for it.
    pub layers: Vec<(String, u64)>,
}

/// An audit event to append.
#[derive(Debug, Clone)]
pub struct NewAuditEvent {
    pub time: String,
    pub tenant: String,
    pub key_id: Option<String>,
    /// The front end the event came through (`crate::auth::Frontend`).
    pub frontend: &'static str,
    pub session_id: Option<String>,
    pub action: String,
    pub detail: serde_json::Value,
    pub outcome: String,
}

/// A stored audit event.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct AuditRow {
    pub id: i64,
    /// RFC 3339, UTC.
    pub time: String,
    /// Empty for requests refused before a tenant was known (401).
    pub tenant: String,
    pub key_id: Option<String>,
    pub session_id: Option<String>,
    pub action: String,
    pub detail: serde_json::Value,
    /// `ok`, `error` or `refused`.
    pub outcome: String,
    /// The front end the event came through: `rest`, `onyx`, `e2b`, `mcp`, or
    /// `daemon` for what the daemon did on its own (expiry, a sandbox that exited).
    pub frontend: String,
}

impl AuditRow {
    fn from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<AuditRow> {
        let detail: Option<String> = row.get(6)?;
        Ok(AuditRow {
            id: row.get(0)?,
            time: row.get::<_, Option<String>>(1)?.unwrap_or_default(),
            tenant: row.get::<_, Option<String>>(2)?.unwrap_or_default(),
            key_id: row.get(3)?,
            session_id: row.get(4)?,
            action: row.get::<_, Option<String>>(5)?.unwrap_or_default(),
            detail: detail
                .and_then(|d| serde_json::from_str(&d).ok())
                .unwrap_or(serde_json::Value::Null),
            outcome: row.get::<_, Option<String>>(7)?.unwrap_or_default(),
            frontend: row.get(8)?,
        })
    }
}

/// Which audit events to read; `None` fields do not filter. `since`/`until` are in
/// the stored time form (see [`parse_rfc3339`]): `since` inclusive, `until` exclusive;
/// `after_id` exclusive.
#[derive(Debug, Clone, Default)]
pub struct AuditFilter {
    pub tenant: Option<String>,
    pub session_id: Option<String>,
    pub action: Option<String>,
    pub outcome: Option<String>,
    pub since: Option<String>,
    pub until: Option<String>,
    pub after_id: Option<i64>,
    /// Events up to this id (inclusive).
    pub max_id: Option<i64>,
    pub limit: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_db() -> (tempfile::TempDir, Db) {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("brig.db")).unwrap();
        (dir, db)
    }

    #[test]
    fn times_have_fixed_width_and_sort() {
        let t = OffsetDateTime::from_unix_timestamp(1_700_000_000).unwrap();
        assert_eq!(rfc3339(t), "2023-11-14T22:13:20.000Z");
        let later = OffsetDateTime::from_unix_timestamp_nanos(1_700_000_000_500_000_000).unwrap();
        assert_eq!(rfc3339(later), "2023-11-14T22:13:20.500Z");
        assert!(rfc3339(t) < rfc3339(later));
        assert_eq!(now_rfc3339().len(), 24);
        assert_eq!(
            parse_rfc3339("2023-11-15T00:13:20.5+02:00").as_deref(),
            Some("2023-11-14T22:13:20.500Z")
        );
        assert_eq!(parse_rfc3339("yesterday"), None);
        assert_eq!(parse_rfc3339("2023-11-15"), None);
        assert!(rfc3339_after(Duration::from_secs(60)) > now_rfc3339());
        assert_eq!(rfc3339_after(Duration::MAX), "9999-12-31T23:59:59.999Z");
        assert!(rfc3339_before(Duration::from_secs(60)) < now_rfc3339());
        assert_eq!(rfc3339_before(Duration::MAX), "0000-01-01T00:00:00.000Z");
        let three_millennia = Duration::from_secs(3000 * 366 * 86_400);
        assert_eq!(rfc3339_before(three_millennia), "0000-01-01T00:00:00.000Z");
    }

    #[tokio::test]
    async fn wal_mode_and_pragmas() {
        let (_dir, db) = temp_db();
        for _ in 0..POOL_SIZE * 2 {
            let (mode, fk, sync): (String, i64, i64) = db
                .call(|conn| {
                    Ok((
                        conn.pragma_query_value(None, "journal_mode", |r| r.get(0))?,
                        conn.pragma_query_value(None, "foreign_keys", |r| r.get(0))?,
                        conn.pragma_query_value(None, "synchronous", |r| r.get(0))?,
                    ))
                })
                .await
                .unwrap();
            assert_eq!(mode, "wal");
            assert_eq!(fk, 1);
            assert_eq!(sync, 1, "NORMAL");
        }
    }

    /// A cached statement is compiled once, whatever is bound to it: the tenant sums
    /// (run at every session create and upload) name their tenant parameter more than
    /// once, which made SQLite compile them again at each new binding.
    #[tokio::test]
    async fn cached_statements_are_not_recompiled_for_new_bindings() {
        let (_dir, db) = temp_db();
        for (sql, tenant) in [(STORED_BYTES, "acme"), (STORED_BYTES, "globex")]
            .into_iter()
            .chain([(SNAPSHOT_BYTES, "acme"), (SNAPSHOT_BYTES, "globex")])
        {
            db.quick(move |conn| {
                conn.prepare_cached(sql)?
                    .query_row([tenant], |row| row.get::<_, i64>(0))
            })
            .await
            .unwrap();
        }
        for sql in [STORED_BYTES, SNAPSHOT_BYTES] {
            let recompiled = db
                .quick(move |conn| {
                    Ok(conn
                        .prepare_cached(sql)?
                        .get_status(rusqlite::StatementStatus::RePrepare))
                })
                .await
                .unwrap();
            assert_eq!(recompiled, 0, "{sql}");
        }
    }

    #[tokio::test]
    async fn audit_retention_reads_through_the_time_index() {
        let (_dir, db) = temp_db();
        let plan = db
            .quick(|conn| {
                let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {PRUNE_AUDIT}"))?;
                let details = stmt.query_map(params!["", 1], |row| row.get::<_, String>(3))?;
                details.collect::<Result<Vec<_>, _>>()
            })
            .await
            .unwrap();
        // A scan of the table would read every event at every tick.
        assert!(
            plan.iter()
                .any(|step| step.contains("INDEX audit_time (time<?)")),
            "{plan:?}"
        );
        assert!(
            !plan.iter().any(|step| step.starts_with("SCAN audit")),
            "{plan:?}"
        );
    }

    /// The WAL's length in frames (what a passive checkpoint reports as its log).
    async fn wal_frames(db: &Db) -> i64 {
        db.call(|conn| conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| r.get(1)))
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn the_checkpointer_rewinds_the_wal_so_the_next_write_does_not() {
        let (_dir, db) = temp_db();
        for i in 0..50 {
            db.quick(move |conn| {
                conn.execute("INSERT INTO tenants (name) VALUES (?1)", [format!("t{i}")])
            })
            .await
            .unwrap();
        }
        let before = wal_frames(&db).await;
        assert!(before >= 50, "the writes are in the WAL: {before} frames");
        let wal = db.path().with_extension("db-wal");
        let wal_bytes = || std::fs::metadata(&wal).unwrap().len();
        let (header, frame) = (32, 24 + 4096);
        assert!(wal_bytes() >= header + 50 * frame);
        db.call(checkpoint).await.unwrap();
        // Started over by the checkpointer's own frame: the next request's write appends
        // to a WAL whose header is written and synced already.
        assert_eq!(wal_frames(&db).await, 1);
        // ... and cut back to that frame, so that it appends past the end of the file
        // rather than over old pages the kernel may have dropped (see open_connection).
        assert_eq!(wal_bytes(), header + frame);
        db.quick(|conn| conn.execute("INSERT INTO tenants (name) VALUES ('after')", []))
            .await
            .unwrap();
        assert_eq!(wal_frames(&db).await, 2, "appended, not started over");
        assert_eq!(wal_bytes(), header + 2 * frame);
        let version: i64 = db
            .call(|conn| conn.pragma_query_value(None, "user_version", |r| r.get(0)))
            .await
            .unwrap();
        assert_eq!(
            version,
            MIGRATIONS.len() as i64,
            "the rewind changed nothing"
        );
        let names: i64 = db
            .call(|conn| conn.query_row("SELECT COUNT(*) FROM tenants", [], |r| r.get(0)))
            .await
            .unwrap();
        assert!(names >= 51);
    }

    /// Pages read through a map stay mapped, which proactive reclaim leaves alone
    /// (see open_connection): the database is read through one on every connection.
    #[tokio::test]
    async fn every_connection_reads_the_database_through_a_map() {
        let (_dir, db) = temp_db();
        let mapped = || {
            std::fs::read_to_string("/proc/self/maps")
                .unwrap()
                .lines()
                .filter(|line| line.ends_with(&*db.path().to_string_lossy()))
                .count()
        };
        let size = |conn: &mut Connection| {
            conn.query_row("SELECT COUNT(*) FROM tenants", [], |r| r.get::<_, i64>(0))?;
            conn.pragma_query_value(None, "mmap_size", |r| r.get::<_, i64>(0))
        };
        assert_eq!(db.quick(size).await.unwrap(), MMAP_BYTES);
        assert_eq!(db.call(size).await.unwrap(), MMAP_BYTES);
        assert!(mapped() > 0, "the database file is not mapped");
    }

    #[tokio::test]
    async fn quick_waits_for_another_writer_on_the_blocking_pool() {
        let (dir, db) = temp_db();
        let path = dir.path().join("brig.db");
        let (locked, is_locked) = std::sync::mpsc::channel();
        let holder = std::thread::spawn(move || {
            let mut conn = open_connection(&path).unwrap();
            let tx = conn.transaction().unwrap();
            tx.execute("INSERT INTO tenants (name) VALUES ('holder')", [])
                .unwrap();
            locked.send(()).unwrap();
            std::thread::sleep(Duration::from_millis(300));
            tx.commit().unwrap();
        });
        is_locked.recv().unwrap();
        let started = std::time::Instant::now();
        let inserted = db
            .quick(|conn| conn.execute("INSERT INTO tenants (name) VALUES ('quick')", []))
            .await
            .unwrap();
        assert_eq!(inserted, 1);
        assert!(
            started.elapsed() >= Duration::from_millis(200),
            "quick did not wait for the writer: {:?}",
            started.elapsed()
        );
        holder.join().unwrap();
        let names: Vec<String> = db
            .quick(|conn| {
                let mut stmt = conn.prepare("SELECT name FROM tenants ORDER BY name")?;
                let rows = stmt.query_map([], |r| r.get(0))?;
                rows.collect()
            })
            .await
            .unwrap();
        assert_eq!(names, ["holder", "quick"]);
        // Its writes are counted for the checkpointer; reads are not.
        assert_eq!(db.pool.quick_commits.load(Ordering::Relaxed), 0);
        db.quick(|conn| conn.execute("INSERT INTO tenants (name) VALUES ('more')", []))
            .await
            .unwrap();
        assert_eq!(db.pool.quick_commits.load(Ordering::Relaxed), 1);
    }

    #[tokio::test]
    async fn the_database_and_its_side_files_are_the_owners_only() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("brig.db");
        // A file someone made readable to others is narrowed.
        std::fs::write(&path, b"").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let db = Db::open(&path).unwrap();
        db.call(|c| c.execute_batch("CREATE TABLE t (x); INSERT INTO t VALUES (1);"))
            .await
            .unwrap();
        for name in ["brig.db", "brig.db-wal", "brig.db-shm"] {
            let mode = std::fs::metadata(dir.path().join(name))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o077, 0, "{name}: {mode:o}");
        }
    }

    #[tokio::test]
    async fn migrations_are_versioned_and_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("brig.db");
        drop(Db::open(&path).unwrap());
        let db = Db::open(&path).unwrap();
        let version: i64 = db
            .call(|c| c.pragma_query_value(None, "user_version", |r| r.get(0)))
            .await
            .unwrap();
        assert_eq!(version, MIGRATIONS.len() as i64);
        let tables: Vec<String> = db
            .call(|c| {
                let mut s = c.prepare(
                    "SELECT name FROM sqlite_master WHERE type = 'table' \
                     AND name NOT LIKE 'sqlite_%' ORDER BY name",
                )?;
                let rows = s.query_map([], |r| r.get(0))?;
                rows.collect()
            })
            .await
            .unwrap();
        assert_eq!(
            tables,
            [
                "audit",
                "files",
                "keys",
                "processes",
                "sessions",
                "snapshot_images",
                "snapshot_layers",
                "snapshots",
                "tenants",
                "volumes"
            ]
        );
        // A database from a newer brig is refused with a clear message.
        db.call(|c| c.pragma_update(None, "user_version", 99))
            .await
            .unwrap();
        drop(db);
        let err = format!("{:#}", Db::open(&path).err().unwrap());
        assert!(err.contains("newer"), "{err}");
    }

    #[tokio::test]
    async fn a_panicking_closure_returns_its_connection() {
        let (_dir, db) = temp_db();
        for _ in 0..POOL_SIZE + 1 {
            let err = db
                .call(|_conn| -> rusqlite::Result<()> { panic!("boom") })
                .await
                .unwrap_err();
            assert_eq!(err.code.as_str(), "internal");
        }
        assert_eq!(db.call(|_| Ok(7)).await.unwrap(), 7);
    }

    #[tokio::test]
    async fn keys_and_tenants() {
        let (_dir, db) = temp_db();
        let key = KeyRow {
            id: "key_00000001".into(),
            tenant: "acme".into(),
            name: Some("ci".into()),
            created_at: now_rfc3339(),
            revoked_at: None,
        };
        assert!(db.insert_key(key.clone(), "h1".into()).await.unwrap());
        assert!(
            !db.insert_key(key.clone(), "h2".into()).await.unwrap(),
            "id taken"
        );
        assert!(
            !db.ensure_tenant("acme").await.unwrap(),
            "created with the key"
        );
        assert_eq!(db.key_by_hash("h1").await.unwrap(), Some(key.clone()));
        assert!(db.has_live_key("acme").await.unwrap());
        let revoked = db.revoke_key("key_00000001").await.unwrap().unwrap();
        assert!(revoked.revoked_at.is_some());
        assert_eq!(db.key_by_hash("h1").await.unwrap(), None);
        assert!(!db.has_live_key("acme").await.unwrap());
        // Revoking again keeps the first time.
        let again = db.revoke_key("key_00000001").await.unwrap().unwrap();
        assert_eq!(again.revoked_at, revoked.revoked_at);
        assert_eq!(db.revoke_key("key_nope").await.unwrap(), None);

        let row = db
            .update_tenant_quotas(
                "acme",
                QuotaUpdate {
                    max_sessions: Some(Some(3)),
                    ..Default::default()
                },
            )
            .await
            .unwrap()
            .unwrap();
        assert_eq!(row.max_sessions, Some(3));
        assert_eq!(row.max_disk_bytes, None);
        let row = db
            .update_tenant_quotas(
                "acme",
                QuotaUpdate {
                    max_sessions: Some(None),
                    max_disk_bytes: Some(Some(5)),
                    ..Default::default()
                },
            )
            .await
            .unwrap()
            .unwrap();
        assert_eq!((row.max_sessions, row.max_disk_bytes), (None, Some(5)));
        assert_eq!(db.tenant("acme").await.unwrap(), Some(row));
        assert_eq!(
            db.update_tenant_quotas("nobody", QuotaUpdate::default())
                .await
                .unwrap(),
            None
        );
    }

    /// A snapshot image is listed from before it is packed until it is recorded, and
    /// from its row's delete until it is removed: a listed image without a row is an
    /// orphan; a delete that finds no row lists nothing.
    #[tokio::test]
    async fn snapshot_images_are_listed_while_made_or_removed() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("brig.db")).unwrap();
        let id_of = |image: &str| image.strip_prefix("snap-").map(|hex| format!("snap_{hex}"));
        db.begin_snapshot_image("snap-a").await.unwrap();
        db.begin_snapshot_image("snap-b").await.unwrap();
        db.call(|conn| {
            conn.execute(
                "INSERT INTO snapshots (id, tenant, image, size_bytes) VALUES ('snap_b', 't', '', 0)",
                [],
            )
        })
        .await
        .unwrap();
        let mut listed = db.snapshot_images(id_of).await.unwrap();
        listed.sort();
        assert_eq!(listed, [("snap-a".into(), false), ("snap-b".into(), true)]);
        db.end_snapshot_image("snap-a").await.unwrap();
        db.end_snapshot_image("snap-b").await.unwrap();
        assert!(!db.delete_snapshot("t", "snap_x", "snap-x").await.unwrap());
        assert!(db.delete_snapshot("t", "snap_b", "snap-b").await.unwrap());
        let listed = db.snapshot_images(id_of).await.unwrap();
        assert_eq!(listed, [("snap-b".to_string(), false)]);
    }

    /// A database written by a daemon of schema `version`, holding `rows`, opened
    /// (and so migrated) by this one.
    fn migrated_from(version: usize, rows: &str) -> (tempfile::TempDir, Db) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("brig.db");
        let conn = Connection::open(&path).unwrap();
        for sql in &MIGRATIONS[..version] {
            conn.execute_batch(sql).unwrap();
        }
        conn.pragma_update(None, "user_version", version as i64)
            .unwrap();
        conn.execute_batch(rows).unwrap();
        drop(conn);
        let db = Db::open(&path).unwrap();
        (dir, db)
    }

    #[tokio::test]
    async fn snapshots_made_before_the_layer_table_keep_counting() {
        let (_dir, db) = migrated_from(
            4,
            "INSERT INTO snapshots (id, tenant, image, size_bytes) VALUES
                 ('snap_a', 't', 'alpine', 700), ('snap_b', 't', '', 0),
                 ('snap_c', 'u', '', 5);",
        );
        assert_eq!(db.snapshot_bytes("t").await.unwrap(), 700);
        assert_eq!(db.stored_bytes("u").await.unwrap(), 5);
        assert!(db.delete_snapshot("t", "snap_a", "snap-a").await.unwrap());
        assert_eq!(db.snapshot_bytes("t").await.unwrap(), 0);
    }

    #[tokio::test]
    async fn rows_of_sessions_deleted_before_are_removed_with_their_processes() {
        let (_dir, db) = migrated_from(
            5,
            "INSERT INTO sessions (id, tenant, state, request, deleted_at) VALUES
                 ('ses_gone', 't', 'deleted', '{}', '2026-01-01T00:00:00.000Z'),
                 ('ses_live', 't', 'running', '{}', NULL),
                 ('ses_ending', 't', 'deleting', '{}', NULL),
                 ('pool_1', '', 'pooled', '{}', NULL);
             INSERT INTO processes (session_id, id, tenant, argv) VALUES
                 ('ses_gone', 'p1', 't', '[]'), ('ses_live', 'p1', 't', '[]'),
                 ('ses_never', 'p1', 't', '[]');",
        );
        let ids = |sql: &'static str| {
            db.call(move |c| {
                let mut stmt = c.prepare(sql)?;
                let rows = stmt.query_map([], |r| r.get::<_, String>(0))?;
                rows.collect::<rusqlite::Result<Vec<String>>>()
            })
        };
        // A session still being deleted keeps its row: the next start finishes it.
        assert_eq!(
            ids("SELECT id FROM sessions ORDER BY id").await.unwrap(),
            ["pool_1", "ses_ending", "ses_live"]
        );
        assert_eq!(
            ids("SELECT session_id FROM processes").await.unwrap(),
            ["ses_live"]
        );
        assert_eq!(db.live_session_count("t").await.unwrap(), 2);
    }

    #[tokio::test]
    async fn snapshot_quota_is_checked_with_the_insert_and_counts_each_layer_once() {
        let (_dir, db) = temp_db();
        // In 4 KiB blocks: a file counts as whole blocks.
        const K: u64 = 4096;
        let snapshot = |id: &str, layers: &[(&str, u64)]| SnapshotRow {
            id: id.into(),
            tenant: "t".into(),
            name: None,
            session_id: "ses_1".into(),
            image: "alpine".into(),
            created_at: now_rfc3339(),
            size_bytes: layers.last().map_or(0, |l| l.1),
            mounts: "[]".into(),
            network: None,
            layers: layers.iter().map(|(d, n)| (d.to_string(), *n)).collect(),
        };
        db.insert_snapshot_within(snapshot("a", &[("sha256:1", 40 * K)]), 10 * K, 100 * K)
            .await
            .unwrap();
        // A fork's snapshot holds the layer it builds on too: counted once.
        db.insert_snapshot_within(
            snapshot("b", &[("sha256:1", 40 * K), ("sha256:2", 30 * K)]),
            10 * K,
            100 * K,
        )
        .await
        .unwrap();
        assert_eq!(db.snapshot_bytes("t").await.unwrap(), 70 * K);
        let err = db
            .insert_snapshot_within(snapshot("c", &[("sha256:3", 21 * K)]), 10 * K, 100 * K)
            .await
            .unwrap_err();
        assert_eq!(err.code.as_str(), "quota_exceeded");
        assert!(
            err.message.contains(&format!("{} bytes more", 21 * K)),
            "{}",
            err.message
        );
        let rows: i64 = db
            .call(|c| c.query_row("SELECT COUNT(*) FROM snapshots", [], |r| r.get(0)))
            .await
            .unwrap();
        assert_eq!(rows, 2, "a refused snapshot left its row");
        assert_eq!(db.stored_bytes("t").await.unwrap(), 70 * K);
        // Files and snapshots share the quota, checked in one transaction each.
        let file = FileRow {
            id: "f".into(),
            tenant: "t".into(),
            filename: "f".into(),
            size_bytes: 25 * K,
            sha256: String::new(),
            created_at: now_rfc3339(),
            expires_at: rfc3339_after(Duration::from_secs(60)),
        };
        let err = db
            .insert_file_within(file.clone(), 10 * K, 100 * K)
            .await
            .unwrap_err();
        assert_eq!(err.code.as_str(), "quota_exceeded");
        // Deleting the first frees only what no other snapshot holds.
        assert!(db.delete_snapshot("t", "a", "snap-a").await.unwrap());
        assert!(!db.delete_snapshot("t", "a", "snap-a").await.unwrap());
        assert!(!db.delete_snapshot("other", "b", "snap-b").await.unwrap());
        assert_eq!(db.snapshot_bytes("t").await.unwrap(), 70 * K);
        assert!(db.delete_snapshot("t", "b", "snap-b").await.unwrap());
        assert_eq!(db.snapshot_bytes("t").await.unwrap(), 0);
        db.insert_file_within(file, 10 * K, 100 * K).await.unwrap();
        db.insert_snapshot_within(snapshot("c", &[("sha256:3", 21 * K)]), 10 * K, 100 * K)
            .await
            .unwrap();
        assert_eq!(db.stored_bytes("t").await.unwrap(), 46 * K);
        assert_eq!(db.snapshot_bytes("other").await.unwrap(), 0);
    }

    /// A file of tenant `t`, `size` bytes, expiring in a minute.
    fn file(id: &str, size: u64) -> FileRow {
        FileRow {
            id: id.into(),
            tenant: "t".into(),
            filename: "f".into(),
            size_bytes: size,
            sha256: String::new(),
            created_at: now_rfc3339(),
            expires_at: rfc3339_after(Duration::from_secs(60)),
        }
    }

    #[tokio::test]
    async fn a_batch_of_files_records_those_that_fit_in_one_go() {
        let (_dir, db) = temp_db();
        const K: u64 = 4096;
        db.insert_file_within(file("old", 50 * K), 0, 100 * K)
            .await
            .unwrap();
        // 10 blocks reserved: 40 left, taken in order by what fits (an empty file
        // takes a block too, a byte past 3 blocks takes 4).
        let batch = vec![
            file("a", 30 * K),
            file("b", 20 * K),
            file("c", 6 * K),
            file("d", 0),
            file("e", 3 * K + 1),
        ];
        let recorded = db
            .insert_files_within(batch, 10 * K, 100 * K)
            .await
            .unwrap();
        assert_eq!(recorded, [true, false, true, true, false]);
        assert_eq!(db.stored_bytes("t").await.unwrap(), 87 * K);
        assert!(db.file("t", "a").await.unwrap().is_some());
        assert!(db.file("t", "b").await.unwrap().is_none());
        assert_eq!(
            db.insert_files_within(Vec::new(), 0, 0).await.unwrap(),
            Vec::<bool>::new()
        );
    }

    #[tokio::test]
    async fn file_quota_is_checked_with_the_insert() {
        let (_dir, db) = temp_db();
        // Files count in 4 KiB blocks, at least one.
        const K: u64 = 4096;
        db.insert_file_within(file("a", 60 * K - 100), 0, 100 * K)
            .await
            .unwrap();
        let err = db
            .insert_file_within(file("b", 40 * K + 1), 0, 100 * K)
            .await
            .unwrap_err();
        assert_eq!(err.code.as_str(), "quota_exceeded");
        let err = db
            .insert_file_within(file("b", 30 * K), 20 * K, 100 * K)
            .await
            .unwrap_err();
        assert_eq!(err.code.as_str(), "quota_exceeded");
        db.insert_file_within(file("b", 39 * K), 0, 100 * K)
            .await
            .unwrap();
        db.insert_file_within(file("c", 0), 0, 100 * K)
            .await
            .unwrap();
        let err = db
            .insert_file_within(file("d", 0), 0, 100 * K)
            .await
            .unwrap_err();
        assert_eq!(
            err.code.as_str(),
            "quota_exceeded",
            "an empty file takes a block"
        );
        assert_eq!(db.file_bytes("t").await.unwrap(), 100 * K);
        assert_eq!(db.stored_bytes("t").await.unwrap(), 100 * K);
        assert!(db.file("other", "a").await.unwrap().is_none());
        assert_eq!(db.files("t").await.unwrap().len(), 3);
    }
}
