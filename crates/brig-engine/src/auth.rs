//! API keys, tenants, callers and quotas, and the verbs that manage them.
//!
//! A key is `brig_` followed by 24 random url-safe characters (144 bits from the
//! thread CSPRNG, seeded by the OS). Only its SHA-256 is stored: a slow password hash
//! protects guessable secrets, but a 144-bit random key cannot be guessed, so a fast
//! hash loses nothing and keeps the per-request check cheap. Verified keys are cached
//! in memory (hash -> caller); revoking a key removes it from the cache at once.
//!
//! Tenant `admin` is the administrator: its keys may manage keys and tenants and read
//! every tenant's audit. On first start (no live admin key) the daemon creates tenant
//! `admin` and a key, and writes the key to `<data-dir>/admin.key` (mode 0600).
//!
//! With `--no-auth` (loopback only), a request without a key is tenant `default`
//! (not an admin); a request with a key is still checked and answered 401 if the key
//! is wrong, so a misconfigured client never silently lands in another tenant.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use anyhow::Context;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::audit;
use crate::catalog::Catalog;
use crate::config::Config;
use crate::db::{now_rfc3339, KeyRow, QuotaUpdate, TenantRow};
use crate::fault::Error as ApiError;
use crate::state::Shared;

// Transitional: where the handlers not yet moved out of the engine look for them.

/// The administrators' tenant.
pub const ADMIN_TENANT: &str = "admin";
/// The tenant of requests without a key under `--no-auth`.
pub const DEFAULT_TENANT: &str = "default";

const KEY_PREFIX: &str = "brig_";
const KEY_RANDOM_CHARS: usize = 24;
/// 64 symbols, so a random byte masked to 6 bits picks one uniformly.
const KEY_ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
const MAX_KEY_NAME: usize = 128;

/// Who is calling: the tenant of the key (or `default` under `--no-auth`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Caller {
    pub tenant: String,
    /// `None` for keyless requests under `--no-auth` (and refused requests).
    pub key_id: Option<String>,
    /// Keys of tenant `admin`.
    pub admin: bool,
    /// The way in the call came through, recorded with everything it does.
    pub frontend: Frontend,
}

/// The front end a verb was called through: every audit event names one, so an
/// operator can tell what an agent did over MCP from what a platform did over REST.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Frontend {
    /// brig's own REST API (`/v1/...`) and the CLI, which speaks it.
    #[default]
    Rest,
    /// The onyx code-interpreter routes (`/v1/execute`, `/v1/files`).
    Onyx,
    /// The E2B-compatible API.
    E2b,
    /// The MCP server.
    Mcp,
    /// What the daemon does on its own: expiry, reaping, a sandbox that exited.
    Daemon,
}

impl Frontend {
    /// The stable name stored in the audit log.
    pub const fn as_str(self) -> &'static str {
        match self {
            Frontend::Rest => "rest",
            Frontend::Onyx => "onyx",
            Frontend::E2b => "e2b",
            Frontend::Mcp => "mcp",
            Frontend::Daemon => "daemon",
        }
    }
}

impl Caller {
    /// 403 `forbidden` unless the caller is an administrator.
    pub fn require_admin(&self) -> Result<(), ApiError> {
        if self.admin {
            Ok(())
        } else {
            Err(ApiError::forbidden("this endpoint needs an admin key"))
        }
    }
}

/// Shared with the refusal-audit middleware: the caller extractor fills it, so a
/// refused request is audited under the tenant that made it.
#[derive(Clone, Default, Debug)]
pub struct CallerSlot(pub Arc<std::sync::OnceLock<Caller>>);

/// Effective quotas of a tenant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Quotas {
    pub max_sessions: u64,
    pub max_concurrent_execs: u64,
    /// Counts the disk limit of each live session plus stored files.
    pub max_disk_bytes: u64,
}

/// Keys, tenants' quotas and the limiters of concurrent execs and transfers.
pub struct Auth {
    db: Arc<dyn Catalog>,
    no_auth: bool,
    defaults: Quotas,
    keys: RwLock<KeyCache>,
    /// Tenants' quota overrides, mirrored from the tenants table so that quota
    /// checks (`exec_permit`) need no database round trip.
    overrides: RwLock<HashMap<String, TenantRow>>,
    execs: Arc<Limiter>,
    /// File transfers paced by the client (uploads, archive downloads): each holds
    /// a blocking thread while it lasts, so they are capped like execs (the same
    /// caps, counted apart) and never take every thread the daemon has.
    transfers: Arc<Limiter>,
    /// Running background processes: each holds two of the daemon's descriptors
    /// (its stdin and its connection to init) for as long as it runs.
    processes: Arc<Limiter>,
    tenant_max_processes: u64,
    /// Open streams of background processes' output: each holds what it has built
    /// ahead of its client (up to ~1.5 MiB of escaped output) for as long as the
    /// client is connected.
    streams: Arc<Limiter>,
    /// Snapshots being taken: each copies and packs up to a session's disk.
    snapshots: Arc<Limiter>,
    tenant_max_snapshots: u64,
}

#[derive(Default)]
struct KeyCache {
    /// Bumped by every revocation: a lookup that started before a revocation must
    /// not put its (possibly revoked) result into the cache.
    generation: u64,
    by_hash: HashMap<String, Caller>,
}

struct Limiter {
    /// What is counted, plural, for messages ("execs").
    what: &'static str,
    global_max: u64,
    counts: Mutex<Counts>,
}

#[derive(Default)]
struct Counts {
    global: u64,
    per_tenant: HashMap<String, u64>,
}

/// One running exec or transfer, counted against its tenant's and the global cap
/// until dropped.
#[must_use = "it is counted only while the permit is alive"]
pub struct Permit {
    limiter: Arc<Limiter>,
    tenant: String,
}

impl Limiter {
    fn new(what: &'static str, global_max: u64) -> Arc<Limiter> {
        Arc::new(Limiter {
            what,
            global_max,
            counts: Mutex::new(Counts::default()),
        })
    }

    /// Counts one more for `tenant`, without waiting: 429 `quota_exceeded` at the
    /// tenant's cap, 503 `unavailable` at the global one.
    fn permit(self: &Arc<Self>, tenant: &str, tenant_max: u64) -> Result<Permit, ApiError> {
        let what = self.what;
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        let mine = counts.per_tenant.get(tenant).copied().unwrap_or(0);
        if mine >= tenant_max {
            return Err(ApiError::quota(format!(
                "tenant has {mine} {what} running, its limit is {tenant_max}"
            )));
        }
        if counts.global >= self.global_max {
            return Err(ApiError::unavailable(format!(
                "the daemon runs its maximum of {} concurrent {what}; retry later",
                self.global_max
            )));
        }
        Ok(self.add(&mut counts, tenant))
    }

    /// Counts one more for `tenant` without checking the caps.
    fn count(self: &Arc<Self>, tenant: &str) -> Permit {
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        self.add(&mut counts, tenant)
    }

    fn add(self: &Arc<Self>, counts: &mut Counts, tenant: &str) -> Permit {
        counts.global += 1;
        *counts.per_tenant.entry(tenant.to_string()).or_insert(0) += 1;
        Permit {
            limiter: self.clone(),
            tenant: tenant.to_string(),
        }
    }

    fn running(&self, tenant: &str) -> u64 {
        let counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        counts.per_tenant.get(tenant).copied().unwrap_or(0)
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut counts = self
            .limiter
            .counts
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        counts.global = counts.global.saturating_sub(1);
        if let Some(n) = counts.per_tenant.get_mut(&self.tenant) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                counts.per_tenant.remove(&self.tenant);
            }
        }
    }
}

fn read_lock<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(PoisonError::into_inner)
}

fn write_lock<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(PoisonError::into_inner)
}

/// SHA-256 of a key, lowercase hex (what the keys table stores).
pub fn hash_key(key: &str) -> String {
    hex::encode(Sha256::digest(key.as_bytes()))
}

/// A fresh API key.
pub fn generate_key() -> String {
    let mut bytes = [0u8; KEY_RANDOM_CHARS];
    rand::fill(&mut bytes[..]);
    let mut key = String::with_capacity(KEY_PREFIX.len() + KEY_RANDOM_CHARS);
    key.push_str(KEY_PREFIX);
    key.extend(
        bytes
            .iter()
            .map(|b| char::from(KEY_ALPHABET[usize::from(b & 63)])),
    );
    key
}

fn generate_key_id() -> String {
    format!("key_{}", random_hex(4))
}

/// `bytes` random bytes from the thread CSPRNG, as lowercase hex (2 chars per byte):
/// for ids and unguessable names.
pub fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    rand::fill(&mut buf[..]);
    hex::encode(buf)
}

/// Whether `text` has the shape of a key (checked before hashing or a lookup).
fn looks_like_key(text: &str) -> bool {
    text.strip_prefix(KEY_PREFIX).is_some_and(|rest| {
        rest.len() == KEY_RANDOM_CHARS && rest.bytes().all(|b| KEY_ALPHABET.contains(&b))
    })
}

/// Tenant names become directory names and log fields: 1-64 of `[A-Za-z0-9_-]`,
/// starting with a letter or digit.
pub fn validate_tenant_name(name: &str) -> Result<(), ApiError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid(
            "invalid tenant name: use 1-64 letters, digits, '_' or '-', starting with a letter or digit",
        ))
    }
}

impl Auth {
    /// Loads the tenants' quota overrides.
    pub async fn new(db: Arc<dyn Catalog>, args: &Config) -> anyhow::Result<Auth> {
        let tenants = db
            .tenants()
            .await
            .map_err(|e| anyhow::anyhow!("cannot read tenants: {}", e.message))?;
        Ok(Auth {
            db,
            no_auth: args.no_auth,
            defaults: Quotas {
                max_sessions: args.tenant_max_sessions,
                max_concurrent_execs: args.tenant_max_concurrent_execs,
                max_disk_bytes: args.tenant_max_disk_bytes,
            },
            keys: RwLock::new(KeyCache::default()),
            overrides: RwLock::new(tenants.into_iter().map(|t| (t.name.clone(), t)).collect()),
            execs: Limiter::new("execs", args.max_concurrent_execs as u64),
            transfers: Limiter::new(
                "file transfers",
                args.max_concurrent_execs.min(crate::BLOCKING_THREADS / 4) as u64,
            ),
            processes: Limiter::new(
                "background processes",
                crate::held_to_open_files(args.max_processes, 8, "--max-processes") as u64,
            ),
            tenant_max_processes: args.tenant_max_processes,
            streams: Limiter::new("process output streams", args.max_concurrent_execs as u64),
            snapshots: Limiter::new("snapshots being taken", args.max_snapshots),
            tenant_max_snapshots: args.tenant_max_snapshots,
        })
    }

    /// The caller a request stands for, from the key it presented (if any): 401
    /// `unauthorized` if the key is missing (unless `--no-auth`), malformed, unknown
    /// or revoked.
    pub async fn authenticate(&self, key: Option<&str>) -> Result<Caller, ApiError> {
        match key {
            Some(key) => self.verify(key).await,
            None if self.no_auth => Ok(Caller {
                tenant: DEFAULT_TENANT.to_string(),
                key_id: None,
                admin: false,
                frontend: Frontend::Rest,
            }),
            None => Err(ApiError::unauthorized(
                "missing API key: send Authorization: Bearer <key> or X-API-Key: <key>",
            )),
        }
    }

    /// The caller a key stands for; 401 if unknown or revoked.
    pub async fn verify(&self, key: &str) -> Result<Caller, ApiError> {
        let unknown = || ApiError::unauthorized("unknown or revoked API key");
        if !looks_like_key(key) {
            return Err(unknown());
        }
        let hash = hash_key(key);
        let generation = {
            let cache = read_lock(&self.keys);
            if let Some(caller) = cache.by_hash.get(&hash) {
                return Ok(caller.clone());
            }
            cache.generation
        };
        let row = self.db.key_by_hash(&hash).await?.ok_or_else(unknown)?;
        let caller = Caller {
            admin: row.tenant == ADMIN_TENANT,
            tenant: row.tenant,
            key_id: Some(row.id),
            frontend: Frontend::Rest,
        };
        let mut cache = write_lock(&self.keys);
        if cache.generation == generation {
            cache.by_hash.insert(hash, caller.clone());
        }
        Ok(caller)
    }

    /// Creates a key for `tenant` (and the tenant if new). Returns the key itself,
    /// which is never stored, and its row.
    pub async fn create_key(
        &self,
        tenant: &str,
        name: Option<String>,
    ) -> Result<(String, KeyRow), ApiError> {
        validate_tenant_name(tenant)?;
        // Key ids are 32 random bits: collisions are rare but possible once there are
        // tens of thousands of keys, so retry with a fresh id.
        for _ in 0..8 {
            let key = generate_key();
            let row = KeyRow {
                id: generate_key_id(),
                tenant: tenant.to_string(),
                name: name.clone(),
                created_at: now_rfc3339(),
                revoked_at: None,
            };
            if self.db.insert_key(row.clone(), hash_key(&key)).await? {
                return Ok((key, row));
            }
        }
        Err(ApiError::internal(
            "could not find a free key id in 8 tries",
        ))
    }

    /// Revokes a key; the key as it now is, `None` if unknown. Takes effect at once:
    /// the key is dropped from the cache.
    pub async fn revoke(&self, key_id: &str) -> Result<Option<KeyRow>, ApiError> {
        let row = self.db.revoke_key(key_id).await?;
        let mut cache = write_lock(&self.keys);
        cache.generation += 1;
        cache
            .by_hash
            .retain(|_, caller| caller.key_id.as_deref() != Some(key_id));
        Ok(row)
    }

    /// On first start (no live admin key): creates tenant `admin` and a key, writes
    /// the key to `<data_dir>/admin.key` (mode 0600) and returns that path.
    pub async fn bootstrap_admin(&self, data_dir: &Path) -> anyhow::Result<Option<PathBuf>> {
        let has_key = self
            .db
            .has_live_key(ADMIN_TENANT)
            .await
            .map_err(|e| anyhow::anyhow!("cannot read keys: {}", e.message))?;
        if has_key {
            return Ok(None);
        }
        let key = generate_key();
        let path = data_dir.join("admin.key");
        // The file is written before the key is stored: if the daemon dies in
        // between, the next start finds no admin key and writes a new file, so the
        // file never lags behind the database.
        write_secret_file(&path, &format!("{key}\n"))?;
        let row = KeyRow {
            id: generate_key_id(),
            tenant: ADMIN_TENANT.to_string(),
            name: Some("bootstrap".to_string()),
            created_at: now_rfc3339(),
            revoked_at: None,
        };
        let inserted = self
            .db
            .insert_key(row, hash_key(&key))
            .await
            .map_err(|e| anyhow::anyhow!("cannot store the admin key: {}", e.message))?;
        if !inserted {
            anyhow::bail!("cannot store the admin key: key id collision, start again");
        }
        tracing::info!(path = %path.display(), "created the admin key (tenant \"admin\")");
        Ok(Some(path))
    }

    /// Effective quotas of a tenant: its overrides, else the `brig serve` defaults.
    /// (Served from memory today; a `Result` so that callers need not change if that
    /// ever needs the database.)
    pub async fn quotas(&self, tenant: &str) -> Result<Quotas, ApiError> {
        Ok(self.quotas_now(tenant))
    }

    fn quotas_now(&self, tenant: &str) -> Quotas {
        let overrides = read_lock(&self.overrides);
        let row = overrides.get(tenant);
        Quotas {
            max_sessions: row
                .and_then(|r| r.max_sessions)
                .unwrap_or(self.defaults.max_sessions),
            max_concurrent_execs: row
                .and_then(|r| r.max_concurrent_execs)
                .unwrap_or(self.defaults.max_concurrent_execs),
            max_disk_bytes: row
                .and_then(|r| r.max_disk_bytes)
                .unwrap_or(self.defaults.max_disk_bytes),
        }
    }

    /// The bound on a tenant's sessions' network policies, if an administrator set one.
    pub fn network_bound(&self, tenant: &str) -> Option<crate::egress::Network> {
        read_lock(&self.overrides)
            .get(tenant)
            .and_then(|r| r.network_bound.as_deref())
            .and_then(|json| serde_json::from_str(json).ok())
    }

    /// Changes a tenant's quotas; `None` if there is no such tenant.
    pub async fn set_quotas(
        &self,
        tenant: &str,
        update: QuotaUpdate,
    ) -> Result<Option<TenantRow>, ApiError> {
        let row = self.db.update_tenant_quotas(tenant, update).await?;
        if let Some(row) = &row {
            write_lock(&self.overrides).insert(row.name.clone(), row.clone());
        }
        Ok(row)
    }

    /// Counts one exec against the tenant's and the global cap, without waiting:
    /// 429 `quota_exceeded` at the tenant's cap, 503 `unavailable` at the global one.
    pub fn exec_permit(&self, tenant: &str) -> Result<Permit, ApiError> {
        let tenant_max = self.quotas_now(tenant).max_concurrent_execs;
        self.execs.permit(tenant, tenant_max)
    }

    /// Counts one client-paced file transfer, as [`Auth::exec_permit`] counts an
    /// exec: under the same caps (the global one held to a quarter of the daemon's
    /// blocking threads), counted apart from execs.
    pub fn transfer_permit(&self, tenant: &str) -> Result<Permit, ApiError> {
        let tenant_max = self.quotas_now(tenant).max_concurrent_execs;
        self.transfers.permit(tenant, tenant_max)
    }

    /// Counts one running background process (`--tenant-max-processes`,
    /// `--max-processes`).
    pub fn process_permit(&self, tenant: &str) -> Result<Permit, ApiError> {
        self.processes.permit(tenant, self.tenant_max_processes)
    }

    /// Counts one open stream of a background process's output, as an exec counts
    /// (the same caps, counted apart).
    pub fn stream_permit(&self, tenant: &str) -> Result<Permit, ApiError> {
        let tenant_max = self.quotas_now(tenant).max_concurrent_execs;
        self.streams.permit(tenant, tenant_max)
    }

    /// Counts one snapshot being taken (`--tenant-max-snapshots`,
    /// `--max-snapshots`).
    pub fn snapshot_permit(&self, tenant: &str) -> Result<Permit, ApiError> {
        self.snapshots.permit(tenant, self.tenant_max_snapshots)
    }

    /// Counts a background process already running (one a previous daemon
    /// started), whatever the caps: it holds its descriptors all the same.
    pub fn running_process(&self, tenant: &str) -> Permit {
        self.processes.count(tenant)
    }

    /// Execs running now for a tenant.
    pub fn running_execs(&self, tenant: &str) -> u64 {
        self.execs.running(tenant)
    }
}

/// Writes a secret to `path` with mode 0600: a temporary file is created with that
/// mode (never widened, never chmod-ed afterwards), synced, then renamed into place.
fn write_secret_file(path: &Path, content: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut suffix = [0u8; 6];
    rand::fill(&mut suffix[..]);
    let tmp = dir.join(format!(".admin.key.{}", hex::encode(suffix)));
    let result = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        file.write_all(content.as_bytes())?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.with_context(|| format!("cannot write {}", path.display()))
}

// ---------------------------------------------------------------------------------
// Verbs: keys, tenants and quotas

/// What a tenant uses now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Usage {
    pub sessions: u64,
    pub concurrent_execs: u64,
    pub file_bytes: u64,
    pub volume_bytes: u64,
    pub snapshot_bytes: u64,
    /// The `disk` limits of its live sessions: reserved whether written or not.
    pub session_disk_bytes: u64,
    /// What counts against `max_disk_bytes`: the four byte counts above together.
    pub disk_bytes: u64,
}

/// A tenant with its quotas and what it uses.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TenantInfo {
    pub tenant: String,
    pub created_at: String,
    pub quotas: Quotas,
    /// The bound on its sessions' network policies (`None`: the daemon's only).
    pub network_bound: Option<crate::egress::Network>,
    pub usage: Usage,
}

async fn tenant_info(state: &Shared, row: TenantRow) -> Result<TenantInfo, ApiError> {
    let file_bytes = state.db.file_bytes(&row.name).await?;
    let volume_bytes = crate::volumes::usage(state, &row.name).await?;
    let snapshot_bytes = state.db.snapshot_bytes(&row.name).await?;
    let session_disk_bytes = crate::filestore::reserved_disk(state, &row.name);
    let usage = Usage {
        sessions: state.db.live_session_count(&row.name).await?,
        concurrent_execs: state.auth.running_execs(&row.name),
        file_bytes,
        volume_bytes,
        snapshot_bytes,
        session_disk_bytes,
        disk_bytes: [file_bytes, volume_bytes, snapshot_bytes, session_disk_bytes]
            .into_iter()
            .fold(0, u64::saturating_add),
    };
    Ok(TenantInfo {
        quotas: state.auth.quotas(&row.name).await?,
        network_bound: state.auth.network_bound(&row.name),
        tenant: row.name,
        created_at: row.created_at,
        usage,
    })
}

/// Creates a key for `tenant` (and the tenant if new), named `name` (admin). Returns
/// the key itself, shown this once, and its row. Audited as `key.create`.
pub async fn create_key(
    state: &Shared,
    caller: &Caller,
    tenant: &str,
    name: Option<String>,
) -> Result<(String, KeyRow), ApiError> {
    caller.require_admin()?;
    let name = match name {
        Some(name) if name.chars().count() > MAX_KEY_NAME || name.chars().any(char::is_control) => {
            return Err(ApiError::invalid(format!(
                "invalid key name: at most {MAX_KEY_NAME} characters, no control characters"
            )));
        }
        name => name,
    };
    let (key, row) = state.auth.create_key(tenant, name).await?;
    audit::record(
        state,
        caller,
        None,
        "key.create",
        serde_json::json!({"key_id": row.id, "tenant": row.tenant, "name": row.name}),
        "ok",
    )
    .await;
    Ok((key, row))
}

/// The keys an administrator sees (every tenant's) or a tenant sees (its own).
pub async fn list_keys(state: &Shared, caller: &Caller) -> Result<Vec<KeyRow>, ApiError> {
    let scope = (!caller.admin).then_some(caller.tenant.as_str());
    state.db.keys(scope).await
}

/// Revokes a key (admin), at once; 404 if there is no such key. Audited as
/// `key.revoke`.
pub async fn revoke_key(state: &Shared, caller: &Caller, key_id: &str) -> Result<KeyRow, ApiError> {
    caller.require_admin()?;
    let Some(row) = state.auth.revoke(key_id).await? else {
        return Err(ApiError::not_found(format!("no key {key_id}")));
    };
    audit::record(
        state,
        caller,
        None,
        "key.revoke",
        serde_json::json!({"key_id": row.id, "tenant": row.tenant}),
        "ok",
    )
    .await;
    Ok(row)
}

/// Every tenant with its quotas and usage (admin).
pub async fn list_tenants(state: &Shared, caller: &Caller) -> Result<Vec<TenantInfo>, ApiError> {
    caller.require_admin()?;
    let mut tenants = Vec::new();
    for row in state.db.tenants().await? {
        tenants.push(tenant_info(state, row).await?);
    }
    Ok(tenants)
}

/// One tenant's quotas and usage: any tenant for an administrator, otherwise the
/// caller's own (another tenant's name is 404, as an unknown one: tenants do not
/// learn of each other).
pub async fn tenant(state: &Shared, caller: &Caller, tenant: &str) -> Result<TenantInfo, ApiError> {
    let unknown = || ApiError::not_found(format!("no tenant {tenant}"));
    if !caller.admin && caller.tenant != tenant {
        return Err(unknown());
    }
    let row = state.db.tenant(tenant).await?.ok_or_else(unknown)?;
    tenant_info(state, row).await
}

/// Changes a tenant's quotas (admin): an absent field (`None`) is left alone,
/// `Some(None)` resets the quota to the daemon's default. 404 for an unknown tenant.
/// Audited as `tenant.quotas`.
pub async fn set_quotas(
    state: &Shared,
    caller: &Caller,
    tenant: &str,
    update: QuotaUpdate,
) -> Result<TenantInfo, ApiError> {
    caller.require_admin()?;
    // SQLite stores signed 64-bit integers.
    let check = |field: &str, v: Option<Option<u64>>| match v {
        Some(Some(n)) if i64::try_from(n).is_err() => Err(ApiError::invalid(format!(
            "{field} is too large: at most {}",
            i64::MAX
        ))),
        other => Ok(other),
    };
    // A bound is checked and stored in its canonical form; a bad one changes nothing.
    let network_bound = match &update.network_bound {
        Some(Some(json)) => {
            let network: crate::egress::Network = serde_json::from_str(json)
                .map_err(|e| ApiError::invalid(format!("network_bound: {e}")))?;
            let network = network.normalized()?;
            Some(Some(
                serde_json::to_string(&network).map_err(ApiError::internal)?,
            ))
        }
        other => other.clone(),
    };
    let update = QuotaUpdate {
        max_sessions: check("max_sessions", update.max_sessions)?,
        max_concurrent_execs: check("max_concurrent_execs", update.max_concurrent_execs)?,
        max_disk_bytes: check("max_disk_bytes", update.max_disk_bytes)?,
        network_bound,
    };
    let detail = serde_json::json!({
        "tenant": tenant,
        "max_sessions": update.max_sessions,
        "max_concurrent_execs": update.max_concurrent_execs,
        "max_disk_bytes": update.max_disk_bytes,
        "network_bound": update.network_bound.as_ref().map(|b| b.as_deref().and_then(|j| serde_json::from_str::<serde_json::Value>(j).ok())),
    });
    let bound_changed = update.network_bound.is_some();
    let Some(row) = state.auth.set_quotas(tenant, update).await? else {
        return Err(ApiError::not_found(format!("no tenant {tenant}")));
    };
    if bound_changed {
        crate::sessions::rebound(state, tenant);
    }
    audit::record(state, caller, None, "tenant.quotas", detail, "ok").await;
    tenant_info(state, row).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_shape() {
        let key = generate_key();
        assert!(looks_like_key(&key), "{key}");
        assert_eq!(key.len(), 5 + 24);
        assert_ne!(key, generate_key());
        assert_eq!(hash_key(&key).len(), 64);
        for bad in ["", "brig_", "brig_short", "nope_aaaaaaaaaaaaaaaaaaaaaaaa"] {
            assert!(!looks_like_key(bad), "{bad}");
        }
        assert!(!looks_like_key(&format!("{key}x")));
        assert!(!looks_like_key("brig_aaaaaaaaaaaaaaaaaaaaaaa!"));
        let id = generate_key_id();
        assert!(id.starts_with("key_") && id.len() == 12, "{id}");
    }

    #[test]
    fn tenant_names() {
        for good in ["a", "acme", "team-1", "A_b", &"x".repeat(64)] {
            validate_tenant_name(good).unwrap();
        }
        for bad in ["", "-a", "_a", "a b", "a/b", "..", "é", &"x".repeat(65)] {
            assert!(validate_tenant_name(bad).is_err(), "{bad}");
        }
    }

    async fn auth_with(config: Config) -> (tempfile::TempDir, Auth) {
        let dir = tempfile::tempdir().unwrap();
        let db = crate::db::Db::open(&dir.path().join("brig.db")).unwrap();
        let auth = Auth::new(Arc::new(db), &config).await.unwrap();
        (dir, auth)
    }

    #[tokio::test]
    async fn verify_cache_and_revoke() {
        let (_dir, auth) = auth_with(Config::default()).await;
        let (key, row) = auth.create_key("acme", Some("ci".into())).await.unwrap();
        let caller = auth.verify(&key).await.unwrap();
        assert_eq!(
            caller,
            Caller {
                tenant: "acme".into(),
                key_id: Some(row.id.clone()),
                admin: false,
                frontend: Frontend::Rest,
            }
        );
        // Cached now; revocation must still take effect at once.
        auth.verify(&key).await.unwrap();
        auth.revoke(&row.id).await.unwrap().unwrap();
        assert_eq!(
            auth.verify(&key).await.unwrap_err().code.as_str(),
            "unauthorized"
        );
        assert_eq!(
            auth.verify(&generate_key())
                .await
                .unwrap_err()
                .code
                .as_str(),
            "unauthorized"
        );
        assert!(auth.create_key("bad name", None).await.is_err());
        let (admin_key, _) = auth.create_key(ADMIN_TENANT, None).await.unwrap();
        assert!(auth.verify(&admin_key).await.unwrap().admin);
    }

    #[tokio::test]
    async fn bootstrap_writes_a_private_key_once() {
        use std::os::unix::fs::PermissionsExt;
        let (dir, auth) = auth_with(Config::default()).await;
        let path = auth.bootstrap_admin(dir.path()).await.unwrap().unwrap();
        assert_eq!(path, dir.path().join("admin.key"));
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let key = std::fs::read_to_string(&path).unwrap();
        let caller = auth.verify(key.trim()).await.unwrap();
        assert!(caller.admin);
        assert_eq!(auth.bootstrap_admin(dir.path()).await.unwrap(), None);
        // Once every admin key is revoked, the next start makes a new one.
        auth.revoke(caller.key_id.as_deref().unwrap())
            .await
            .unwrap();
        assert!(auth.bootstrap_admin(dir.path()).await.unwrap().is_some());
        let key2 = std::fs::read_to_string(&path).unwrap();
        assert_ne!(key, key2);
        let leftovers: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with(".admin.key"))
            .collect();
        assert!(leftovers.is_empty());
    }

    #[tokio::test]
    async fn no_auth_default_tenant() {
        let (_dir, auth) = auth_with(Config {
            no_auth: true,
            ..Config::default()
        })
        .await;
        let caller = auth.authenticate(None).await.unwrap();
        assert_eq!(caller.tenant, DEFAULT_TENANT);
        assert!(!caller.admin);
        assert_eq!(
            auth.authenticate(Some("brig_wrong"))
                .await
                .unwrap_err()
                .code
                .as_str(),
            "unauthorized"
        );
        let (_dir, auth) = auth_with(Config::default()).await;
        assert_eq!(
            auth.authenticate(None).await.unwrap_err().code.as_str(),
            "unauthorized"
        );
    }

    #[tokio::test]
    async fn exec_permits() {
        let (_dir, auth) = auth_with(Config {
            max_concurrent_execs: 3,
            tenant_max_concurrent_execs: 2,
            ..Config::default()
        })
        .await;
        let a1 = auth.exec_permit("a").unwrap();
        let a2 = auth.exec_permit("a").unwrap();
        let err = auth.exec_permit("a").err().unwrap();
        assert_eq!(err.code.as_str(), "quota_exceeded");
        let b1 = auth.exec_permit("b").unwrap();
        let err = auth.exec_permit("b").err().unwrap();
        assert_eq!(err.code.as_str(), "unavailable");
        assert_eq!(auth.running_execs("a"), 2);
        drop(a1);
        assert_eq!(auth.running_execs("a"), 1);
        let b2 = auth.exec_permit("b").unwrap();
        drop((a2, b1, b2));
        assert_eq!(auth.running_execs("a"), 0);
        assert_eq!(auth.running_execs("b"), 0);

        // A tenant override takes effect at once, and a 0 quota disables execs.
        auth.create_key("c", None).await.unwrap();
        auth.set_quotas(
            "c",
            QuotaUpdate {
                max_concurrent_execs: Some(Some(0)),
                ..Default::default()
            },
        )
        .await
        .unwrap()
        .unwrap();
        assert_eq!(
            auth.exec_permit("c").err().unwrap().code.as_str(),
            "quota_exceeded"
        );
        assert_eq!(auth.quotas("c").await.unwrap().max_concurrent_execs, 0);
        assert_eq!(auth.quotas("c").await.unwrap().max_sessions, 100);
        assert_eq!(auth.quotas("zzz").await.unwrap().max_disk_bytes, 10 << 30);
    }
}
