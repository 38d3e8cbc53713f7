//! Live sandboxes: create (cold or from the warm pool), list, delete, pause and
//! resume, expiry, and re-attaching after a daemon restart.
//!
//! Each session's sandbox is started by the daemon's backend (see
//! [`crate::backend`]; namespaces: the launch helper) and then lives on
//! its own. The daemon keeps a [`Session`] in memory per live sandbox and a row in
//! SQLite with everything needed to find it again (its backend and the backend's
//! `runtime` record), so a restarted daemon re-attaches to every sandbox still alive
//! and cleans up the rest.

mod cut;
pub mod entries;
pub mod exec;
pub mod files;
mod locks;
pub mod pool;
pub mod processes;
mod shared;
pub mod snapshots;
pub mod stats;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use brig_policy::{parse_cpus_millis, SandboxSpec};
use serde::{Deserialize, Serialize};

use crate::audit;
use crate::auth::Caller;
use crate::backend::{Launch, Sandbox};
use crate::db::{now_rfc3339, NewAuditEvent, SessionRow, StoredSession};
use crate::fault::Error as ApiError;
use crate::state::{AppState, Shared};
pub use shared::{BundleMount, FileRef, SessionInfo, Size};

/// How often the reaper looks for expired and idle sessions.
const REAP_INTERVAL: Duration = Duration::from_secs(1);

/// The longest `ttl_seconds` and `idle_timeout_seconds` (ten years): beyond any real
/// use, and far from overflowing the unix times they are added to.
const MAX_LIFETIME_SECONDS: u64 = 10 * 365 * 24 * 3600;

/// Limits of a session's sandbox; each defaults to `brig run`'s default.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionLimits {
    /// Memory of the whole sandbox, tmpfs included (e.g. "512M").
    pub memory: Option<Size>,
    pub pids: Option<u64>,
    /// CPUs, fractional allowed (e.g. 0.5 or "1.5"): a number or a numeric
    /// string, checked by [`limits_of`].
    pub cpus: Option<serde_json::Value>,
    /// All writable storage together (the upper layer, /tmp, /workspace).
    pub disk: Option<Size>,
    pub nofile: Option<u64>,
    pub file_size: Option<Size>,
}

/// What a session is created from; stored (as JSON) in its row, so a restarted
/// daemon re-creates the session's view of itself.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateSession {
    pub image: Option<String>,
    pub snapshot: Option<String>,
    pub env: Option<BTreeMap<String, String>>,
    pub limits: Option<SessionLimits>,
    /// Uploaded tar bundles bound read-only. A fork (`snapshot`) without `mounts`
    /// gets the mounts of the session its snapshot was taken from.
    pub mounts: Option<Vec<BundleMount>>,
    /// The tenant's persistent volume of that name, read-write at `/volume`
    /// (created on first use).
    pub volume: Option<String>,
    /// The capacity of `volume` when this request makes it (default 1 GiB; fixed
    /// once made: another value for an existing volume is 409), e.g. "10G".
    pub volume_size: Option<Size>,
    pub files: Option<Vec<FileRef>>,
    pub ttl_seconds: Option<u64>,
    pub idle_timeout_seconds: Option<u64>,
    /// The caller's own labels (e.g. `{"user": "u42", "chat": "c7"}`), returned with
    /// the session and matched by `GET /v1/sessions?metadata=K=V`: at most
    /// 16 entries, keys 1-64 characters of `A-Z a-z 0-9 _ . -`, values at most 256
    /// bytes.
    pub metadata: Option<BTreeMap<String, String>>,
    /// Where the session may connect (see [`crate::egress`]); the daemon's
    /// `--session-network` when absent (a fork: its snapshot's session's). A live
    /// session keeps the policy in force apart (its row's `network` column).
    pub network: Option<crate::egress::Network>,
    /// Secrets the sandbox sees as placeholders only (see [`crate::secrets`]).
    /// Never serialized: the stored request holds no value.
    #[serde(default, skip_serializing)]
    pub secrets: Option<Vec<crate::secrets::SecretRequest>>,
    /// Another path the workspace is reached at, for clients that expect a home
    /// (E2B's `/home/user`): a symlink to /workspace on the host's system dirs,
    /// whose root is read-only; a directory of the sandbox user's in an image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub home: Option<String>,
    /// The sandbox user's name in its /etc/passwd (E2B's `user`); `sandbox` when
    /// absent. Its uid is the same either way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// At its TTL the session is paused, not ended, and kept paused this many
    /// seconds more (E2B's `autoPause`); resuming it is the client's to do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause_at_expiry: Option<u64>,
}

/// Bounds of a session's `metadata`: labels to find sessions by, not storage.
const METADATA_ENTRIES: usize = 16;
const METADATA_KEY_CHARS: usize = 64;
const METADATA_VALUE_BYTES: usize = 256;

/// A `metadata` key's shape: a front end checks the keys of a filter with it as it
/// parses them, so the first bad part of a query is the one reported.
pub fn check_metadata_key(key: &str) -> Result<(), ApiError> {
    let valid = !key.is_empty()
        && key.len() <= METADATA_KEY_CHARS
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
    if valid {
        Ok(())
    } else {
        Err(ApiError::invalid(format!(
            "metadata key {key:?}: 1-{METADATA_KEY_CHARS} characters of A-Z a-z 0-9 _ . -"
        )))
    }
}

fn check_metadata(metadata: &BTreeMap<String, String>) -> Result<(), ApiError> {
    if metadata.len() > METADATA_ENTRIES {
        return Err(ApiError::invalid(format!(
            "metadata has {} entries, at most {METADATA_ENTRIES}",
            metadata.len()
        )));
    }
    for (key, value) in metadata {
        check_metadata_key(key)?;
        if value.len() > METADATA_VALUE_BYTES {
            return Err(ApiError::invalid(format!(
                "metadata {key}: the value is {} bytes, at most {METADATA_VALUE_BYTES}",
                value.len()
            )));
        }
    }
    Ok(())
}

/// What can change in a live session ([`update_session`]). Fields left out stay as
/// they are.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UpdateSession {
    /// The session now ends this many seconds from now: a keep-alive for a session
    /// still in use near its end, or an earlier end.
    pub ttl_seconds: Option<u64>,
    /// A new idle timeout; 0 for none.
    pub idle_timeout_seconds: Option<u64>,
    /// Replaces the labels, all of them (`{}` removes them); the bounds of create's.
    pub metadata: Option<BTreeMap<String, String>>,
    /// Replaces the network policy, for connections made from then on (open ones
    /// keep going). A session started without a way out (mode `none`) cannot get
    /// one: 409.
    pub network: Option<crate::egress::Network>,
}

fn check_ttl(ttl: u64) -> Result<(), ApiError> {
    if ttl == 0 || ttl > MAX_LIFETIME_SECONDS {
        return Err(ApiError::invalid(format!(
            "ttl_seconds must be between 1 and {MAX_LIFETIME_SECONDS}"
        )));
    }
    Ok(())
}

fn check_idle_timeout(seconds: u64) -> Result<(), ApiError> {
    if seconds > MAX_LIFETIME_SECONDS {
        return Err(ApiError::invalid(format!(
            "idle_timeout_seconds must be at most {MAX_LIFETIME_SECONDS}"
        )));
    }
    Ok(())
}

impl CreateSession {
    /// What a session of this request holds on the host for `tenant`.
    pub fn held(&self, tenant: &str) -> Vec<Held> {
        let files = self.mounts.iter().flatten().map(|m| Held::File {
            tenant: tenant.to_string(),
            file_id: m.file_id.clone(),
        });
        let volume = self.volume.iter().map(|name| Held::Volume {
            tenant: tenant.to_string(),
            name: name.clone(),
        });
        let snapshot = self.snapshot.iter().map(|id| Held::Snapshot {
            tenant: tenant.to_string(),
            id: id.clone(),
        });
        files.chain(volume).chain(snapshot).collect()
    }
}

/// Something on the host that a session uses besides its sandbox and that must
/// not be deleted while the session lives: its volume, the bundles it mounts; or
/// while it starts: the snapshot it starts from (a live session has its layers).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Held {
    Volume { tenant: String, name: String },
    File { tenant: String, file_id: String },
    Snapshot { tenant: String, id: String },
}

/// What creates under way hold before they are live sessions, and the lock that
/// makes "nobody uses it, delete it" atomic with respect to new claims: a create
/// claims under the lock (then checks that the thing still exists), a delete checks
/// live sessions and claims and removes under it.
///
/// A snapshot is deleted differently, as only starts under way hold it: the delete
/// closes it (starts that claim it from then on are refused), waits until the starts
/// that claimed it before have ended, then removes it.
#[derive(Default)]
pub struct Holds {
    pending: Mutex<HashMap<Held, usize>>,
    /// Things being deleted, by how many deletes.
    closing: Mutex<HashMap<Held, usize>>,
    /// Notified whenever a claim ends.
    released: tokio::sync::Notify,
    lock: tokio::sync::Mutex<()>,
}

impl Holds {
    pub async fn lock(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.lock.lock().await
    }

    /// Holds `held` until the returned claim is dropped (once the session is live,
    /// or the create failed).
    pub async fn claim(&self, held: Vec<Held>) -> Claim<'_> {
        let _lock = self.lock.lock().await;
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        for h in &held {
            *pending.entry(h.clone()).or_default() += 1;
        }
        Claim { holds: self, held }
    }

    /// How many creates under way hold `held`.
    pub fn pending(&self, held: &Held) -> usize {
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(held)
            .copied()
            .unwrap_or(0)
    }

    fn pending_files(&self) -> Vec<String> {
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .filter_map(|h| match h {
                Held::File { file_id, .. } => Some(file_id.clone()),
                Held::Volume { .. } | Held::Snapshot { .. } => None,
            })
            .collect()
    }

    /// Marks `held` as being deleted, until the returned guard is dropped; see
    /// [`Holds::is_closing`].
    pub async fn close(&self, held: Held) -> Closing<'_> {
        let _lock = self.lock.lock().await;
        *self
            .closing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(held.clone())
            .or_default() += 1;
        Closing { holds: self, held }
    }

    /// Whether a delete of `held` is under way: a create that claimed it checks this
    /// after its claim, and gives up if so.
    pub fn is_closing(&self, held: &Held) -> bool {
        self.closing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(held)
    }

    /// Waits until no create under way holds `held`.
    pub async fn settled(&self, held: &Held) {
        loop {
            let released = self.released.notified();
            tokio::pin!(released);
            // Registered before the check, so a claim ending in between is not missed.
            released.as_mut().enable();
            if self.pending(held) == 0 {
                return;
            }
            released.await;
        }
    }
}

/// See [`Holds::close`].
pub struct Closing<'a> {
    holds: &'a Holds,
    held: Held,
}

impl Drop for Closing<'_> {
    fn drop(&mut self) {
        let mut closing = self.holds.closing.lock().unwrap_or_else(|e| e.into_inner());
        count_down(&mut closing, &self.held);
    }
}

/// One fewer of `held` in `counts`, which keeps only counts above zero.
fn count_down(counts: &mut HashMap<Held, usize>, held: &Held) {
    if let Some(n) = counts.get_mut(held) {
        *n -= 1;
        if *n == 0 {
            counts.remove(held);
        }
    }
}

/// See [`Holds::claim`].
pub struct Claim<'a> {
    holds: &'a Holds,
    held: Vec<Held>,
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        let mut pending = self.holds.pending.lock().unwrap_or_else(|e| e.into_inner());
        for h in &self.held {
            count_down(&mut pending, h);
        }
        drop(pending);
        self.holds.released.notify_waiters();
    }
}

/// The live sessions that hold `held`, by id.
pub fn users(shared: &Shared, held: &Held) -> Vec<String> {
    let Some(sessions) = shared.sessions.get() else {
        return Vec::new();
    };
    let mut ids: Vec<String> = sessions
        .all()
        .iter()
        .filter(|s| s.request.held(&s.tenant).contains(held))
        .map(|s| s.id.clone())
        .collect();
    ids.sort();
    ids
}

/// Ids of the files that live sessions mount or creates under way claim.
pub fn files_in_use(shared: &Shared) -> std::collections::HashSet<String> {
    let mut ids: std::collections::HashSet<String> =
        shared.holds.pending_files().into_iter().collect();
    if let Some(sessions) = shared.sessions.get() {
        for session in sessions.all() {
            ids.extend(
                session
                    .request
                    .mounts
                    .iter()
                    .flatten()
                    .map(|m| m.file_id.clone()),
            );
        }
    }
    ids
}

/// A live session.
pub struct Session {
    pub id: String,
    pub tenant: String,
    /// Replaced by `restore`.
    sandbox: RwLock<Arc<dyn Sandbox>>,
    /// What created it; its `metadata` is taken out into `terms`, its secrets
    /// into `secrets`.
    pub request: CreateSession,
    /// Its secrets, served by its proxy; fixed for its life.
    pub(crate) secrets: Vec<crate::secrets::SessionSecret>,
    pub created_at: String,
    terms: Mutex<Terms>,
    /// Serializes updates of `terms`, each written to the database before it shows.
    updating: tokio::sync::Mutex<()>,
    /// Unix seconds of the last request touching the session.
    last_active: AtomicI64,
    /// `last_active` as last written to the session's row (see [`save_activity`]).
    saved_active: AtomicI64,
    pub paused: AtomicBool,
    pub pooled: bool,
    pub disk_bytes: u64,
    pub limits: brig_policy::Limits,
    /// Execs hold it shared; pause, snapshot, restore and delete exclusively.
    pub gate: tokio::sync::RwLock<()>,
    /// Changes through the files API and a snapshot's copy exclude each other.
    pub cut: cut::Cut,
    /// stdin of background processes, by process id (lost on restart).
    pub stdin: Mutex<HashMap<u64, tokio::net::unix::pipe::Sender>>,
    pub deleted: AtomicBool,
    /// How many times processes of the session were killed for holding more file
    /// locks than its budget (see `locks`); an exec compares it before and after.
    pub lock_kills: AtomicU64,
    /// When its locks may be counted next (see `brig_jail::locks::next_count`).
    pub(super) next_lock_count: Mutex<Option<std::time::Instant>>,
    /// Its egress proxy, for a session started with a way out: dropped, it stops
    /// serving.
    pub(crate) egress: Mutex<Option<crate::egress::Proxy>>,
    /// Its interpreter's contexts (in memory: they end with the daemon).
    pub interpreter: crate::interpreter::Contexts,
    /// Woken when one of its background processes has ended (its end recorded), so
    /// that a stream following it ends now rather than at its next look.
    pub process_ended: tokio::sync::Notify,
}

/// What of a session can change after create (`PATCH /v1/sessions/{id}`).
#[derive(Debug, Clone, Default)]
struct Terms {
    /// Unix seconds; `None` never expires.
    expires_at: Option<i64>,
    idle_timeout_seconds: Option<u64>,
    metadata: BTreeMap<String, String>,
    /// The network policy in force; `None`: started without a way out.
    network: Option<crate::egress::Network>,
}

impl Terms {
    /// The create request as a session's row stores it: with these labels (a restart
    /// takes them from there).
    fn stored_request(&self, request: &CreateSession) -> Result<String, ApiError> {
        let request = CreateSession {
            metadata: (!self.metadata.is_empty()).then(|| self.metadata.clone()),
            ..request.clone()
        };
        serde_json::to_string(&request).map_err(ApiError::internal)
    }

    /// The network policy as a session's row stores it.
    fn stored_network(&self) -> Result<Option<String>, ApiError> {
        self.network
            .as_ref()
            .map(serde_json::to_string)
            .transpose()
            .map_err(ApiError::internal)
    }
}

impl Session {
    fn terms(&self) -> std::sync::MutexGuard<'_, Terms> {
        self.terms.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn sandbox(&self) -> Arc<dyn Sandbox> {
        self.sandbox
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Swaps in a new sandbox (restore); returns the old one.
    pub fn replace_sandbox(&self, launched: Arc<dyn Sandbox>) -> Arc<dyn Sandbox> {
        let mut sandbox = self.sandbox.write().unwrap_or_else(|e| e.into_inner());
        std::mem::replace(&mut *sandbox, launched)
    }

    /// The network policy in force; `None` for a session started without a way out.
    pub fn network(&self) -> Option<crate::egress::Network> {
        self.terms().network.clone()
    }

    /// Serves the session's egress through `proxy` (the old one's listeners close).
    pub(crate) fn set_proxy(&self, proxy: Option<crate::egress::Proxy>) {
        let old = std::mem::replace(
            &mut *self.egress.lock().unwrap_or_else(|e| e.into_inner()),
            proxy,
        );
        drop(old);
    }

    pub fn dir(&self, shared: &Shared) -> PathBuf {
        session_dir(shared, &self.id)
    }

    pub fn touch(&self) {
        self.last_active.store(unix_now(), Ordering::Relaxed);
    }

    pub fn info(&self) -> SessionInfo {
        let sandbox = self.sandbox();
        let terms = self.terms().clone();
        SessionInfo {
            session_id: self.id.clone(),
            state: if self.paused.load(Ordering::Relaxed) {
                "paused"
            } else {
                "running"
            }
            .into(),
            image: self.request.image.clone(),
            snapshot: self.request.snapshot.clone(),
            created_at: self.created_at.clone(),
            expires_at: terms.expires_at.map(rfc3339),
            idle_timeout_seconds: terms.idle_timeout_seconds,
            last_active_at: rfc3339(self.last_active.load(Ordering::Relaxed)),
            pooled: self.pooled,
            mounts: self.request.mounts.clone().unwrap_or_default(),
            volume: self.request.volume.clone(),
            metadata: terms.metadata,
            network: terms.network.unwrap_or_default(),
            secrets: self.secrets.iter().map(|s| s.info()).collect(),
            limits: serde_json::to_value(&self.limits).unwrap_or_default(),
            enforced: sandbox.facts().enforced.clone(),
        }
    }

    /// The environment an exec starts from: the sandbox's (brig defaults, image),
    /// then the session's own.
    pub fn base_env(&self) -> BTreeMap<String, String> {
        let mut env: BTreeMap<String, String> =
            self.sandbox().facts().env.iter().cloned().collect();
        if let Some(own) = &self.request.env {
            env.extend(own.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        env
    }
}

pub fn unix_now() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

pub fn rfc3339(unix: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp(unix)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default()
}

fn session_dir(shared: &Shared, id: &str) -> PathBuf {
    shared.data_dir.join("sessions").join(id)
}

/// Every live session, by id.
pub struct Sessions {
    live: RwLock<Live>,
    pub pool: pool::Pool,
    /// Serializes quota checks with the inserts they guard (see [`Sessions::admit`]).
    admission: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct Live {
    by_id: HashMap<String, Arc<Session>>,
    /// Sessions and their disk limits summed per tenant, changed with `by_id` under
    /// the same lock: quota checks read it instead of walking every session.
    /// Creates admitted but not yet live count in it too (see [`Reservation`]).
    per_tenant: HashMap<String, TenantUsage>,
    /// Creates admitted but not yet live, all tenants together.
    reserved: usize,
}

/// A create admitted by the quota checks but not yet live: it counts as a session of
/// its tenant, with its disk, until dropped (after the session is inserted, or when
/// the create fails). So the admission lock is not held while its sandbox starts,
/// which takes seconds for a fork of a large snapshot: one tenant's forks held up
/// every other tenant's creates that long.
pub(crate) struct Reservation<'a> {
    sessions: &'a Sessions,
    tenant: String,
    disk_bytes: u64,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        let mut live = self
            .sessions
            .live
            .write()
            .unwrap_or_else(|e| e.into_inner());
        live.reserved = live.reserved.saturating_sub(1);
        live.release(&self.tenant, self.disk_bytes);
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TenantUsage {
    pub sessions: u64,
    pub disk_bytes: u64,
}

impl Sessions {
    /// Re-attaches to the sandboxes of the previous daemon, cleans up those that are
    /// gone or expired, and starts the reaper and the warm pool.
    pub async fn start(shared: &Arc<Shared>) -> anyhow::Result<Sessions> {
        shared.backend.prepare()?;
        std::fs::create_dir_all(shared.data_dir.join("sessions"))?;
        let sessions = Sessions {
            live: RwLock::new(Live::default()),
            pool: pool::Pool::new(&shared.args),
            admission: tokio::sync::Mutex::new(()),
        };
        sessions.reattach(shared).await?;
        Ok(sessions)
    }

    /// Background work, started once the state holds `self`.
    pub fn spawn_tasks(state: &AppState) {
        let reaper = state.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(REAP_INTERVAL);
            loop {
                tick.tick().await;
                reap_expired(&reaper).await;
                save_activity(&reaper).await;
            }
        });
        pool::spawn_filler(state);
        locks::spawn_watch(state);
        for session in state.sessions().all() {
            watch_exit(state, &session);
            // The background processes a previous daemon started: their ends are
            // recorded, and they count against the process caps, as before.
            let (state, session) = (state.clone(), session.clone());
            tokio::spawn(async move { processes::rewatch(&state, &session).await });
        }
    }

    pub fn get(&self, id: &str) -> Option<Arc<Session>> {
        self.live
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .by_id
            .get(id)
            .cloned()
    }

    pub fn all(&self) -> Vec<Arc<Session>> {
        self.live
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .by_id
            .values()
            .cloned()
            .collect()
    }

    fn insert(&self, session: Arc<Session>) {
        let mut live = self.live.write().unwrap_or_else(|e| e.into_inner());
        let usage = live.per_tenant.entry(session.tenant.clone()).or_default();
        usage.sessions += 1;
        usage.disk_bytes += session.disk_bytes;
        if let Some(old) = live.by_id.insert(session.id.clone(), session) {
            live.forget(&old);
        }
    }

    fn remove(&self, id: &str) -> Option<Arc<Session>> {
        let mut live = self.live.write().unwrap_or_else(|e| e.into_inner());
        let removed = live.by_id.remove(id);
        if let Some(session) = &removed {
            live.forget(session);
        }
        removed
    }

    /// A tenant's live sessions and their disk limits.
    pub fn usage(&self, tenant: &str) -> TenantUsage {
        self.live
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .per_tenant
            .get(tenant)
            .copied()
            .unwrap_or_default()
    }

    /// The lock under which a tenant's disk and session quotas are checked and what
    /// they admit is recorded: a session create, a volume's growth.
    pub async fn admit(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.admission.lock().await
    }

    pub fn of_tenant(&self, tenant: &str) -> Vec<Arc<Session>> {
        let mut list: Vec<_> = self
            .all()
            .into_iter()
            .filter(|s| s.tenant == tenant)
            .collect();
        list.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
        list
    }

    /// Live sessions.
    pub fn count(&self) -> usize {
        self.live
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .by_id
            .len()
    }

    /// Live sessions, and creates admitted but not yet live: what `--max-sessions`
    /// counts.
    fn count_admitted(&self) -> usize {
        let live = self.live.read().unwrap_or_else(|e| e.into_inner());
        live.by_id.len() + live.reserved
    }

    /// Counts an admitted create as a session of `tenant` until the reservation is
    /// dropped; call under the admission lock, after the quota checks.
    fn reserve(&self, tenant: &str, disk_bytes: u64) -> Reservation<'_> {
        let mut live = self.live.write().unwrap_or_else(|e| e.into_inner());
        live.reserved += 1;
        let usage = live.per_tenant.entry(tenant.to_string()).or_default();
        usage.sessions += 1;
        usage.disk_bytes += disk_bytes;
        Reservation {
            sessions: self,
            tenant: tenant.to_string(),
            disk_bytes,
        }
    }

    async fn reattach(&self, shared: &Arc<Shared>) -> anyhow::Result<()> {
        let rows = shared
            .db
            .stored_sessions()
            .await
            .map_err(|e| anyhow::anyhow!(e.message))?;
        let now = unix_now();
        let backend = &shared.backend;
        // Rows of another backend are left for a daemon that runs it.
        let mut foreign = std::collections::HashSet::new();
        for StoredSession {
            id,
            tenant,
            state,
            request,
            runtime,
            backend: kind,
            created_at,
            expires_at,
            idle_timeout_s: idle,
            last_active_at: last_active,
            network,
            secrets,
        } in rows
        {
            if kind != backend.kind() {
                tracing::warn!(session = %id, backend = %kind, "not re-attached: this daemon runs another sandbox backend");
                foreign.insert(id);
                continue;
            }
            let launched: Option<Arc<dyn Sandbox>> =
                runtime.as_deref().and_then(|r| backend.reattach(r));
            let expires = expires_at.as_deref().and_then(parse_rfc3339);
            let last_active = parse_rfc3339(&last_active).unwrap_or(now);
            let idle_over = idle.is_some_and(|s| now - last_active > s);
            let alive = launched.as_ref().is_some_and(|l| l.reachable());
            let keep = alive
                && state != "pooled"
                && state != "deleting"
                && expires.is_none_or(|e| e > now)
                && !idle_over;
            if !keep {
                let why = if !alive {
                    "sandbox gone"
                } else if state == "pooled" {
                    "pool sandbox of the previous daemon"
                } else {
                    "expired while the daemon was down"
                };
                tracing::info!(session = %id, "cleaning up session at start: {why}");
                if let Some(launched) = launched {
                    let _ = launched.destroy().await;
                    release_deleted_snapshot_layers(shared, &*launched).await;
                }
                // Its directory goes in `sweep`, with any sandbox recorded only there.
                let _ = shared.db.forget_session(&id).await;
                continue;
            }
            let Some(launched) = launched else { continue };
            // A daemon killed during a snapshot leaves the sandbox frozen (its init
            // too, so nothing would answer): only a paused session stays frozen.
            if state != "paused" {
                let _ = launched.freeze(false).await;
            }
            let mut request: CreateSession = serde_json::from_str(&request).unwrap_or_default();
            let secrets = crate::secrets::from_stored(secrets.as_deref()).unwrap_or_else(|e| {
                tracing::warn!(session = %id, "its secrets are unreadable, none served: {e}");
                Vec::new()
            });
            let limits = limits_of(&request).unwrap_or_default();
            let network: Option<crate::egress::Network> =
                network.and_then(|json| serde_json::from_str(&json).ok());
            let terms = Terms {
                expires_at: expires,
                idle_timeout_seconds: idle.map(|s| s as u64),
                metadata: request.metadata.take().unwrap_or_default(),
                network: network.clone(),
            };
            let session = Session {
                id: id.clone(),
                tenant,
                sandbox: RwLock::new(launched),
                disk_bytes: limits.disk_bytes,
                limits,
                request,
                secrets,
                created_at,
                terms: Mutex::new(terms),
                updating: tokio::sync::Mutex::new(()),
                last_active: AtomicI64::new(last_active),
                saved_active: AtomicI64::new(last_active),
                paused: AtomicBool::new(state == "paused"),
                pooled: false,
                gate: tokio::sync::RwLock::new(()),
                cut: cut::Cut::default(),
                stdin: Mutex::new(HashMap::new()),
                deleted: AtomicBool::new(false),
                lock_kills: AtomicU64::new(0),
                next_lock_count: Mutex::new(None),
                interpreter: Default::default(),
                process_ended: Default::default(),
                egress: Mutex::new(None),
            };
            // Its listeners went with the previous daemon; until they are bound
            // again nothing leaves (the namespace has only lo).
            if let Some(network) = &network {
                let sandbox = session.sandbox();
                let proxy = async {
                    let policies = crate::egress::policies(shared, &session.tenant, network)?;
                    crate::egress::attach(
                        shared,
                        &session.tenant,
                        &id,
                        &sandbox,
                        policies,
                        &session.secrets,
                        false,
                    )
                    .await
                };
                match proxy.await {
                    Ok(proxy) => {
                        *session.egress.lock().unwrap_or_else(|e| e.into_inner()) = Some(proxy)
                    }
                    Err(e) => {
                        tracing::warn!(session = %id, "egress not served again: {}", e.message)
                    }
                }
            }
            tracing::info!(session = %id, "re-attached");
            self.insert(Arc::new(session));
        }
        self.sweep(shared, &foreign).await;
        Ok(())
    }

    /// Destroys the sandboxes no row knows (the backend finds them in session
    /// directories): those of a daemon that died between a launch and storing its
    /// result, or in the middle of a restore. Then removes every directory that
    /// belongs to no live session (nor to a row of another backend, `foreign`).
    async fn sweep(&self, shared: &Shared, foreign: &std::collections::HashSet<String>) {
        let Ok(dirs) = std::fs::read_dir(shared.data_dir.join("sessions")) else {
            return;
        };
        for dir in dirs.flatten() {
            let id = dir.file_name().to_string_lossy().into_owned();
            if foreign.contains(&id) {
                continue;
            }
            let current = self.get(&id).map(|s| s.sandbox());
            shared.backend.sweep(&dir.path(), current.as_deref()).await;
            if current.is_none() {
                let _ = std::fs::remove_dir_all(dir.path());
            }
        }
    }
}

impl Live {
    /// Takes a session that left `by_id` out of its tenant's usage.
    fn forget(&mut self, session: &Session) {
        self.release(&session.tenant, session.disk_bytes);
    }

    fn release(&mut self, tenant: &str, disk_bytes: u64) {
        if let Some(usage) = self.per_tenant.get_mut(tenant) {
            usage.sessions = usage.sessions.saturating_sub(1);
            usage.disk_bytes = usage.disk_bytes.saturating_sub(disk_bytes);
            if usage.sessions == 0 {
                self.per_tenant.remove(tenant);
            }
        }
    }
}

pub fn parse_rfc3339(text: &str) -> Option<i64> {
    time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
        .ok()
        .map(|t| t.unix_timestamp())
}

/// The spec a session starts from when the request names no limits: the CLI's
/// defaults, minus the run timeout (a session lives until its TTL).
pub fn base_spec() -> SandboxSpec {
    let mut spec = SandboxSpec::new(Vec::new());
    spec.limits.timeout_ms = None;
    spec
}

/// The sandbox limits a request asks for, on top of `brig run`'s defaults.
pub fn limits_of(request: &CreateSession) -> Result<brig_policy::Limits, ApiError> {
    let mut limits = base_spec().limits;
    let Some(asked) = &request.limits else {
        return Ok(limits);
    };
    if let Some(memory) = &asked.memory {
        limits.memory_bytes = Some(memory.bytes()?);
    }
    if let Some(pids) = asked.pids {
        limits.pids = Some(pids);
    }
    if let Some(cpus) = &asked.cpus {
        let text = match cpus {
            serde_json::Value::Number(n) => n.to_string(),
            serde_json::Value::String(s) => s.clone(),
            _ => {
                return Err(ApiError::invalid(
                    "limits.cpus must be a number or a string",
                ))
            }
        };
        limits.cpus_millis =
            Some(parse_cpus_millis(&text).map_err(|e| ApiError::invalid(e.to_string()))?);
    }
    if let Some(disk) = &asked.disk {
        limits.disk_bytes = disk.bytes()?;
    }
    if let Some(nofile) = asked.nofile {
        // No sandbox can get more than the host's hard limit (raising it needs
        // CAP_SYS_RESOURCE): a bad value, refused before anything is started.
        let hard = rustix::process::getrlimit(rustix::process::Resource::Nofile).maximum;
        if hard.is_some_and(|hard| nofile > hard) {
            return Err(ApiError::invalid(format!(
                "limits.nofile {nofile} is over this host's hard limit of {} open files",
                hard.unwrap_or_default()
            )));
        }
        limits.nofile = nofile;
    }
    if let Some(size) = &asked.file_size {
        limits.file_size_bytes = Some(size.bytes()?);
    }
    Ok(limits)
}

/// Refuses limits over the daemon's `--max-session-*`: a session's cgroup takes
/// what it is given, and memory, processes and CPU are the host's, shared by every
/// tenant.
pub fn check_limit_caps(
    limits: &brig_policy::Limits,
    args: &crate::Config,
) -> Result<(), ApiError> {
    let over = |what: &str, asked: String, flag: &str, cap: String| {
        Err(ApiError::invalid(format!(
            "limits.{what} {asked} is over this daemon's {flag} of {cap}"
        )))
    };
    if let Some(memory) = limits.memory_bytes {
        if memory > args.max_session_memory_bytes {
            let show = |bytes: u64| format!("{} MiB", bytes >> 20);
            let cap = args.max_session_memory_bytes;
            return over("memory", show(memory), "--max-session-memory", show(cap));
        }
    }
    if let Some(pids) = limits.pids {
        if pids > args.max_session_pids {
            let cap = args.max_session_pids.to_string();
            return over("pids", pids.to_string(), "--max-session-pids", cap);
        }
    }
    // Asked once: available_parallelism reads the cgroup files of this process,
    // which a pooled create (a fraction of a millisecond) cannot afford each time.
    static HOST_CPUS_MILLIS: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    let cpus_cap = args.max_session_cpus_millis.unwrap_or_else(|| {
        *HOST_CPUS_MILLIS.get_or_init(|| {
            std::thread::available_parallelism().map_or(1000, |n| n.get() as u32 * 1000)
        })
    });
    if let Some(cpus) = limits.cpus_millis {
        if cpus > cpus_cap {
            let show = |millis: u32| format!("{}", f64::from(millis) / 1000.0);
            return over("cpus", show(cpus), "--max-session-cpus", show(cpus_cap));
        }
    }
    Ok(())
}

/// A relative path under /workspace (for `files`), checked by string: the file
/// itself is written through [`crate::rootfs`], which resolves it inside the root.
pub fn workspace_path(relative: &str, cwd: &str) -> Result<String, ApiError> {
    let bad = || {
        ApiError::invalid(format!(
            "path {relative:?} must be relative to the working directory and must not contain '..'"
        ))
    };
    if relative.is_empty()
        || relative.starts_with('/')
        || relative.contains('\0')
        || relative.split('/').any(|c| c == "..")
    {
        return Err(bad());
    }
    Ok(format!("{}/{}", cwd.trim_end_matches('/'), relative))
}

/// Starts a sandbox for session `id` through the daemon's backend: from `image` (a
/// root) or the host's system dirs, whose /tmp and /workspace `seed` (a host
/// snapshot's store image) fills.
pub async fn launch_sandbox(
    shared: &Shared,
    id: &str,
    spec: SandboxSpec,
    image: Option<String>,
    seed: Option<String>,
    background: bool,
) -> Result<Arc<dyn Sandbox>, ApiError> {
    launch_from(shared, id, spec, (image, seed), background, 0).await
}

/// [`launch_sandbox`] numbering its processes after `process_base` (a restore's).
pub async fn launch_from(
    shared: &Shared,
    id: &str,
    spec: SandboxSpec,
    (image, seed): (Option<String>, Option<String>),
    background: bool,
    process_base: u64,
) -> Result<Arc<dyn Sandbox>, ApiError> {
    let launch = Launch {
        dir: session_dir(shared, id),
        spec,
        image,
        seed,
        background,
        process_base,
    };
    shared.backend.launch(launch).await
}

/// Most bundles one session mounts.
const MAX_MOUNTS: usize = 32;

/// Builds the sandbox spec of a session request. Checks paths only: the bundles
/// are extracted by [`prepare_bundles`], the volume made by `volumes::ensure`.
pub fn spec_for(
    shared: &Shared,
    tenant: &str,
    request: &CreateSession,
    limits: &brig_policy::Limits,
) -> Result<SandboxSpec, ApiError> {
    let mut spec = base_spec();
    spec.limits = limits.clone();
    spec.limits.output_limit_bytes = shared.output_limit_bytes();
    let mounts = request.mounts.as_deref().unwrap_or_default();
    if mounts.len() > MAX_MOUNTS {
        return Err(ApiError::invalid(format!(
            "at most {MAX_MOUNTS} mounts per session"
        )));
    }
    for mount in mounts {
        let target = brig_policy::normalize_sandbox_path(&mount.path)
            .map_err(|e| ApiError::invalid(format!("mount path: {e}")))?;
        let volume = crate::volumes::MOUNT_PATH;
        if target == volume || target.starts_with(&format!("{volume}/")) {
            return Err(ApiError::invalid(format!(
                "mount path {target}: {volume} is reserved for the session's volume"
            )));
        }
        // The sandbox's parent clones bind sources as root: the daemon's private
        // data dir is no obstacle. Not idmapped: the extracted files are root's and
        // world-readable, so the sandbox reads them as `nobody`'s, read-only.
        let source = crate::filestore::bundle_path(shared, tenant, &mount.file_id)?;
        spec.filesystem.binds.push(brig_policy::BindMount {
            source,
            target,
            writable: false,
            idmapped: false,
            no_symlinks: false,
        });
    }
    if let Some(name) = &request.volume {
        crate::volumes::validate_name(name)?;
        spec.filesystem.binds.push(brig_policy::BindMount {
            source: crate::volumes::mount_point(shared, tenant, name),
            target: crate::volumes::MOUNT_PATH.into(),
            writable: true,
            idmapped: true,
            no_symlinks: false,
        });
    }
    if let Some(home) = &request.home {
        spec.filesystem.workspace_links.push(home.clone());
    }
    spec.identity.name.clone_from(&request.user);
    // A session runs no command of its own; validation still wants one.
    let mut check = spec.clone();
    check.command = vec!["/bin/true".into()];
    check
        .validate()
        .map_err(|e| ApiError::invalid(e.to_string()))?;
    Ok(spec)
}

/// Extracts the request's bundles (once per file; later calls find them done).
/// An extraction counts in the tenant's disk quota, which must have room for it and
/// `also` (the disk of a session being created: a copy made for a create the quota
/// then refuses would stay, counted). `admitted`: the caller holds the admission
/// lock, under which an extraction records the disk it takes.
pub async fn prepare_bundles(
    state: &AppState,
    tenant: &str,
    request: &CreateSession,
    also: u64,
    admitted: bool,
) -> Result<(), ApiError> {
    for mount in request.mounts.iter().flatten() {
        crate::filestore::bundle_dir(state, tenant, &mount.file_id, also, admitted).await?;
    }
    Ok(())
}

/// Each mounted file must be one of the tenant's stored files (404 otherwise).
async fn check_bundles(
    state: &AppState,
    tenant: &str,
    request: &CreateSession,
) -> Result<(), ApiError> {
    for mount in request.mounts.iter().flatten() {
        crate::filestore::open(state, tenant, &mount.file_id).await?;
    }
    Ok(())
}

/// Creates a session for `caller` as [`create`] does, and records it in the audit
/// log (`session.create`).
pub async fn create_session(
    state: &AppState,
    caller: &Caller,
    request: CreateSession,
) -> Result<SessionInfo, ApiError> {
    let detail = serde_json::json!({
        "image": request.image,
        "snapshot": request.snapshot,
        "limits": request.limits,
        "mounts": request.mounts,
        "volume": request.volume,
        "metadata": request.metadata,
        // Names and hosts: never a value.
        "secrets": request.secrets.as_ref().map(|list| list
            .iter()
            .map(|s| serde_json::json!({"name": s.name, "hosts": s.hosts}))
            .collect::<Vec<_>>()),
    });
    let event = audit::event(caller, None, "session.create", detail.clone(), "ok");
    // In its own task: a client that hangs up mid-launch must not leave a sandbox
    // started but unrecorded.
    let (task_state, task_caller, task_request) = (state.clone(), caller.clone(), request.clone());
    let result = tokio::spawn(async move {
        create_with(&task_state, &task_caller, task_request, Some(event)).await
    })
    .await
    .map_err(ApiError::internal)
    .and_then(|r| r);
    let recorded = matches!(result, Ok((_, true)));
    if !recorded {
        let (outcome, session_id) = match &result {
            Ok((session, _)) => ("ok", Some(session.id.as_str())),
            Err(e) => (e.code.as_str(), None),
        };
        audit::record(state, caller, session_id, "session.create", detail, outcome).await;
    }
    let (session, _) = result?;
    Ok(session.info())
}

/// Creates a session for `caller`: checks quotas, takes a pooled sandbox when one
/// fits or launches one, records it, and copies the requested files in. No audit
/// event: for a session that is part of another verb's work (an onyx execute's).
pub async fn create(
    state: &AppState,
    caller: &Caller,
    request: CreateSession,
) -> Result<Arc<Session>, ApiError> {
    create_with(state, caller, request, None)
        .await
        .map(|(session, _)| session)
}

/// [`create`], also recording `event` (its session id and time filled in) in the
/// transaction that records the session, when nothing can fail after it (a request
/// without files): then the event is stored exactly when the session is, and the
/// client waits for one commit instead of two. Returns whether it was recorded.
async fn create_with(
    state: &AppState,
    caller: &Caller,
    mut request: CreateSession,
    event: Option<NewAuditEvent>,
) -> Result<(Arc<Session>, bool), ApiError> {
    let shared: &Shared = state;
    let limits = limits_of(&request)?;
    check_limit_caps(&limits, &shared.args)?;
    if request.image.is_some() && request.snapshot.is_some() {
        return Err(ApiError::invalid("give either image or snapshot, not both"));
    }
    if let Some(name) = request
        .image
        .as_deref()
        .filter(|n| snapshots::is_snapshot_image(n))
    {
        // A snapshot's image is its tenant's, reached only through `snapshot`,
        // which checks whose it is (and counts its layers in that tenant's quota).
        return Err(ApiError::not_found(format!("no image {name}")));
    }
    if let Some(ttl) = request.ttl_seconds {
        check_ttl(ttl)?;
    }
    if let Some(keep) = request.pause_at_expiry {
        check_ttl(keep)?;
    }
    if let Some(idle) = request.idle_timeout_seconds {
        check_idle_timeout(idle)?;
    }
    for (key, value) in request.env.iter().flatten() {
        exec::check_env_var(key, value)?;
    }
    if let Some(metadata) = &request.metadata {
        check_metadata(metadata)?;
    }
    let volume_size = crate::volumes::requested_capacity(request.volume_size.as_ref())?;
    if volume_size.is_some() && request.volume.is_none() {
        return Err(ApiError::invalid("volume_size needs a volume"));
    }
    if let Some(name) = &request.volume {
        crate::volumes::validate_name(name)?;
        if !rustix::process::geteuid().is_root() {
            return Err(ApiError::invalid(
                "volumes need the daemon to run as root (they are idmapped mounts)",
            ));
        }
    }
    let (image, seed) = match &request.snapshot {
        Some(id) => {
            let source = snapshots::source(state, &caller.tenant, id).await?;
            // A fork keeps the bundles of the session it was snapshotted from (its
            // files expect them), unless it names its own.
            if request.mounts.is_none() && !source.mounts.is_empty() {
                request.mounts = Some(source.mounts.clone());
            }
            // And its network policy, unless it asks for its own.
            if request.network.is_none() {
                request.network = source.network.clone();
            }
            source.start()
        }
        None => (
            request
                .image
                .clone()
                .or_else(|| shared.args.default_session_image.clone()),
            None,
        ),
    };
    if let Some(files) = &request.files {
        for file in files {
            workspace_path(&file.path, brig_policy::defaults::WORKSPACE)?;
            crate::filestore::open(state, &caller.tenant, &file.file_id).await?;
        }
    }
    let mut spec = spec_for(shared, &caller.tenant, &request, &limits)?;
    let network = request
        .network
        .clone()
        .unwrap_or_else(|| shared.egress.default.clone())
        .normalized()?;
    let policies = crate::egress::policies(shared, &caller.tenant, &network)?;
    // A session without a way out is started exactly as before egress existed.
    let egress = (!network.is_none()).then_some((network, policies));
    let secrets = crate::secrets::from_request(
        request.secrets.as_deref().unwrap_or_default(),
        request.env.as_ref(),
        egress.is_some(),
    )?;
    if !secrets.is_empty() {
        let ca = state.egress.ca()?;
        crate::secrets::offer(&mut spec, &secrets, ca.cert_pem());
    }
    if egress.is_some() {
        if !rustix::process::geteuid().is_root() {
            return Err(ApiError::invalid(
                "network: egress needs the daemon to run as root (its listeners are bound in the session's network namespace)",
            ));
        }
        crate::egress::offer(&mut spec);
    }
    check_bundles(state, &caller.tenant, &request).await?;
    // Extracted before the admission lock: a large bundle takes a while.
    prepare_bundles(state, &caller.tenant, &request, limits.disk_bytes, false).await?;

    // Quotas: checked and the session inserted under one lock, so concurrent creates
    // cannot both pass the last free slot.
    let admission = state.sessions().admission.lock().await;
    let sessions = state.sessions();
    if sessions.count_admitted() >= shared.args.max_sessions {
        return Err(ApiError::unavailable(format!(
            "the daemon is at its limit of {} sessions; try again later",
            shared.args.max_sessions
        )));
    }
    let quotas = shared.auth.quotas(&caller.tenant).await?;
    let mine = sessions.usage(&caller.tenant);
    if mine.sessions >= quotas.max_sessions {
        return Err(ApiError::quota(format!(
            "tenant {} is at its limit of {} sessions",
            caller.tenant, quotas.max_sessions
        )));
    }
    let disk_used: u64 = mine
        .disk_bytes
        .saturating_add(shared.db.stored_bytes(&caller.tenant).await?);
    // A volume this create makes reserves its whole capacity.
    let new_volume = match &request.volume {
        Some(name) => {
            crate::volumes::new_capacity(shared, &caller.tenant, name, volume_size).await?
        }
        None => 0,
    };
    if new_volume > 0 && !brig_jail::disk::can_format() {
        return Err(ApiError::invalid(
            "making a volume needs mkfs.ext4 on the daemon's host (install e2fsprogs)",
        ));
    }
    let wanted = disk_used
        .saturating_add(limits.disk_bytes)
        .saturating_add(new_volume);
    if wanted > quotas.max_disk_bytes {
        return Err(ApiError::quota(format!(
            "tenant {0} would use {wanted} of its {1} bytes of disk (GET /v1/tenants/{0} \
             shows what counts)",
            caller.tenant, quotas.max_disk_bytes
        )));
    }

    // Counted from here until the session is live (or the create fails), so the
    // admission lock can go before the sandbox starts. A create that uses a volume
    // keeps it: making and mounting a volume is not safe against a second create of
    // the same one.
    let reservation = sessions.reserve(&caller.tenant, limits.disk_bytes + new_volume);
    let admission = request.volume.is_some().then_some(admission);
    // From here until the session is live, its volume and bundles cannot be deleted.
    let claim = state.holds.claim(request.held(&caller.tenant)).await;
    // One of them may have been deleted before the claim.
    if let Some(id) = &request.snapshot {
        snapshots::still_there(state, &caller.tenant, id).await?;
    }
    check_bundles(state, &caller.tenant, &request).await?;
    prepare_bundles(state, &caller.tenant, &request, limits.disk_bytes, true).await?;
    let made_volume = match &request.volume {
        Some(name) => crate::volumes::ensure(state, &caller.tenant, name, volume_size).await?,
        None => false,
    };
    let started = start_session(
        state,
        caller,
        &request,
        (image, seed),
        (spec, egress),
        secrets,
        limits,
        event,
    )
    .await;
    let (session, recorded) = match started {
        Ok(started) => started,
        Err(e) => {
            if let (true, Some(name)) = (made_volume, &request.volume) {
                crate::volumes::discard_new(state, &caller.tenant, name, 1).await;
            }
            return Err(e);
        }
    };
    sessions.insert(session.clone());
    drop(reservation);
    drop(claim);
    drop(admission);
    watch_exit(state, &session);
    crate::metrics::set_sessions("running", sessions.count() as f64);
    if let (true, Some(name)) = (made_volume, &request.volume) {
        audit::record(
            state,
            caller,
            Some(&session.id),
            "volume.create",
            serde_json::json!({"volume": name}),
            "ok",
        )
        .await;
    }

    if let Some(home) = request.home.clone() {
        // A no-op through the link on the host's system dirs; made in an image.
        let made = files::with_root(&session, move |root| {
            root.mkdir_all(&home).map_err(files::rootfs_error)
        })
        .await;
        if let Err(e) = made {
            let _ = delete(state, &session).await;
            return Err(e);
        }
    }
    if let Some(files) = &request.files {
        if let Err(e) = files::copy_uploads(state, &session, files).await {
            let _ = delete(state, &session).await;
            return Err(e);
        }
    }
    Ok((session, recorded))
}

/// The part of [`create`] that starts the sandbox (from the pool or launched) and
/// records the session; on error nothing of it is left.
#[allow(clippy::too_many_arguments)]
async fn start_session(
    state: &AppState,
    caller: &Caller,
    request: &CreateSession,
    (image, seed): (Option<String>, Option<String>),
    (spec, egress): (SandboxSpec, Option<(crate::egress::Network, Policies)>),
    secrets: Vec<crate::secrets::SessionSecret>,
    limits: brig_policy::Limits,
    event: Option<NewAuditEvent>,
) -> Result<(Arc<Session>, bool), ApiError> {
    let shared: &Shared = state;
    let sessions = state.sessions();
    let id = format!("ses_{}", crate::auth::random_hex(12));
    let now = unix_now();
    let ttl = request
        .ttl_seconds
        .unwrap_or(shared.args.session_ttl_ms / 1000);
    // A request that sets the session's lifetime but no idle timeout gets none: it
    // lives for its TTL, as an onyx python-sandbox session does (onyx has no idle
    // timeout, and its clients, which keep a session between a user's messages,
    // would find it gone). The TTL still bounds it, as `idle_timeout_seconds: 0`
    // with a TTL always could.
    let idle = match (request.idle_timeout_seconds, request.ttl_seconds) {
        (Some(idle), _) => Some(idle),
        (None, Some(_)) => None,
        (None, None) => Some(shared.args.session_idle_timeout_ms / 1000),
    }
    .filter(|s| *s > 0);
    // Pool sandboxes are started without a way out (resolv.conf, proxy variables):
    // a session with one is launched for itself.
    let pooled = if egress.is_none() && pool::fits(request, &limits) {
        sessions.pool.take(image.as_deref())
    } else {
        None
    };
    let (launched, pool_row) = match pooled {
        Some(ready) => {
            let (launched, pool_row) = ready.adopt(state, &id).await?;
            (launched, Some(pool_row))
        }
        None => (
            launch_sandbox(shared, &id, spec, image.clone(), seed, false).await?,
            None,
        ),
    };
    let (network, proxy) = match egress {
        Some((network, policies)) => {
            let attached = crate::egress::attach(
                state,
                &caller.tenant,
                &id,
                &launched,
                policies,
                &secrets,
                true,
            )
            .await;
            match attached {
                Ok(proxy) => (Some(network), Some(proxy)),
                Err(e) => {
                    let _ = launched.destroy().await;
                    let _ = tokio::fs::remove_dir_all(session_dir(shared, &id)).await;
                    return Err(e);
                }
            }
        }
        None => (None, None),
    };
    let session = Arc::new(Session {
        id: id.clone(),
        tenant: caller.tenant.clone(),
        sandbox: RwLock::new(launched),
        disk_bytes: limits.disk_bytes,
        limits,
        request: CreateSession {
            image: image.clone(),
            metadata: None,
            network: None,
            secrets: None,
            ..request.clone()
        },
        secrets,
        // To the millisecond (fixed width, so it sorts as text): lists are in order
        // of creation, and a client makes several sandboxes a second.
        created_at: crate::db::now_rfc3339(),
        terms: Mutex::new(Terms {
            expires_at: Some(now + ttl as i64),
            idle_timeout_seconds: idle,
            metadata: request.metadata.clone().unwrap_or_default(),
            network,
        }),
        updating: tokio::sync::Mutex::new(()),
        last_active: AtomicI64::new(now),
        saved_active: AtomicI64::new(now),
        paused: AtomicBool::new(false),
        pooled: pool_row.is_some(),
        gate: tokio::sync::RwLock::new(()),
        cut: cut::Cut::default(),
        stdin: Mutex::new(HashMap::new()),
        deleted: AtomicBool::new(false),
        lock_kills: AtomicU64::new(0),
        next_lock_count: Mutex::new(None),
        interpreter: Default::default(),
        process_ended: Default::default(),
        egress: Mutex::new(proxy),
    });
    // Files are copied in after the row is written, and if that fails the session is
    // deleted: then the event is the handler's to record, with that outcome.
    let event = event
        .filter(|_| request.files.as_ref().is_none_or(Vec::is_empty) && request.home.is_none());
    let recorded = event.is_some();
    if let Err(e) = record_new(state, &session, pool_row.clone(), event).await {
        destroy_sandbox(state, &session).await;
        if let Some(pool_row) = pool_row {
            // Left by the rolled-back transaction; its sandbox is the one just destroyed.
            let _ = state.db.delete_session_row_quick(&pool_row).await;
        }
        return Err(e);
    }
    Ok((session, recorded))
}

/// A session's egress policy and its tenant's bound.
type Policies = (
    brig_policy::net::EgressPolicy,
    Option<brig_policy::net::EgressPolicy>,
);

/// A session's row in the `sessions` table.
fn session_row(state: &Shared, session: &Session, db_state: &str) -> Result<SessionRow, ApiError> {
    let sandbox = session.sandbox();
    let secrets = crate::secrets::stored(&session.secrets)?;
    let (expires_at, idle_timeout, request, network) = {
        let terms = session.terms();
        let request = terms.stored_request(&session.request)?;
        let network = terms.stored_network()?;
        (
            terms.expires_at,
            terms.idle_timeout_seconds,
            request,
            network,
        )
    };
    Ok(SessionRow {
        id: session.id.clone(),
        tenant: session.tenant.clone(),
        state: db_state.to_string(),
        image: session.request.image.clone(),
        snapshot: session.request.snapshot.clone(),
        request,
        runtime: sandbox.runtime()?,
        backend: state.backend.kind().to_string(),
        created_at: session.created_at.clone(),
        expires_at: expires_at.map(rfc3339),
        idle_timeout_s: idle_timeout.map(|s| s as i64),
        last_active_at: rfc3339(session.last_active.load(Ordering::Relaxed)),
        network,
        secrets,
    })
}

/// Writes a new session's row in one transaction with what goes with it: the removal
/// of the row of the pool sandbox it took (`pool_row`), and its create event.
async fn record_new(
    state: &Shared,
    session: &Session,
    pool_row: Option<String>,
    event: Option<NewAuditEvent>,
) -> Result<(), ApiError> {
    let row = session_row(state, session, "running")?;
    let event = event.map(|mut event| {
        event.session_id = Some(session.id.clone());
        event.time = now_rfc3339();
        let detail = event.detail.to_string();
        (event, detail)
    });
    state.db.insert_session(row, pool_row, event).await
}

/// Writes a change of a live session to its row (never inserts one): 404 if the
/// session has been deleted.
pub async fn persist(state: &Shared, session: &Session, db_state: &str) -> Result<(), ApiError> {
    let row = session_row(state, session, db_state)?;
    let updated = state.db.update_session(row).await?;
    if updated == 0 {
        return Err(gone(session));
    }
    Ok(())
}

/// The answer to a request that finds its session deleted once it may act on it.
pub fn gone(session: &Session) -> ApiError {
    ApiError::not_found(format!("no session {}", session.id))
}

/// For operations that replace or change a session's sandbox: once they hold the
/// gate exclusively, 404 if a delete came first (it has killed the sandbox, or ended
/// the session altogether), so nothing is started or changed for a deleted session.
pub fn ensure_not_deleted(session: &Session) -> Result<(), ApiError> {
    if session.deleted.load(Ordering::SeqCst) {
        return Err(gone(session));
    }
    Ok(())
}

/// Kills the sandbox and removes its cgroup and directory.
async fn destroy_sandbox(state: &Shared, session: &Session) {
    kill_sandbox(state, session, &*session.sandbox()).await;
    let _ = tokio::fs::remove_dir_all(session.dir(state)).await;
}

/// Kills one sandbox of the session and removes its cgroup.
async fn kill_sandbox(state: &Shared, session: &Session, sandbox: &dyn Sandbox) {
    if let Err(e) = sandbox.destroy().await {
        tracing::warn!(session = %session.id, "cleanup: {e}");
    }
    release_deleted_snapshot_layers(state, sandbox).await;
}

/// After a sandbox started from a snapshot has ended: if the snapshot was deleted
/// meanwhile, the layers it alone held were left in the store while the sandbox
/// used them, counted for no tenant; they go now (a store gc: layers no image
/// references and no sandbox uses).
pub(crate) async fn release_deleted_snapshot_layers(state: &Shared, sandbox: &dyn Sandbox) {
    let Some(image) = sandbox
        .facts()
        .image
        .clone()
        .filter(|i| i.starts_with("snap-"))
    else {
        return;
    };
    let store_dir = state.args.store.clone();
    let released = tokio::task::spawn_blocking(move || {
        let store = brig_image::store::Store::open(&store_dir)?;
        if store.has_image(&image) {
            return Ok(None);
        }
        store.gc(false).map(Some)
    })
    .await;
    match released {
        Ok(Ok(Some(report))) if !report.removed_layers.is_empty() => tracing::info!(
            layers = report.removed_layers.len(),
            bytes = report.freed_bytes,
            "removed the layers of deleted snapshots"
        ),
        Ok(Ok(_)) => {}
        Ok(Err(e)) => tracing::warn!("removing the layers of deleted snapshots: {e}"),
        Err(e) => tracing::warn!("removing the layers of deleted snapshots: {e}"),
    }
}

/// Ends a session: marks it, kills its sandbox, cleans up, records the end.
pub async fn delete(state: &AppState, session: &Arc<Session>) -> Result<(), ApiError> {
    if session.deleted.swap(true, Ordering::SeqCst) {
        return Ok(());
    }
    // Marked first: if the daemon dies now, the next one finishes the cleanup.
    state.db.mark_session_deleting(&session.id).await?;
    // Its proxy's listeners close; connections under way end with the sandbox.
    session.set_proxy(None);
    // The sandbox ends before the gate is taken: execs running in it end with it
    // (409) instead of holding the delete, and the reaper, up to their timeouts.
    let sandbox = session.sandbox();
    kill_sandbox(state, session, &*sandbox).await;
    // Waits for running operations that hold the gate (they see `deleted` next).
    let _gate = session.gate.write().await;
    if Arc::ptr_eq(&sandbox, &session.sandbox()) {
        let _ = tokio::fs::remove_dir_all(session.dir(state)).await;
    } else {
        // A restore swapped in a new sandbox meanwhile.
        destroy_sandbox(state, session).await;
    }
    state.sessions().remove(&session.id);
    state.db.forget_session_quick(&session.id).await?;
    crate::metrics::set_sessions("running", state.sessions().count() as f64);
    Ok(())
}

/// A tenant's bound changed: its sessions' proxies decide new connections under the
/// new one (a session whose own mode is now wider keeps it, held by the bound).
pub fn rebound(state: &Shared, tenant: &str) {
    let Some(sessions) = state.sessions.get() else {
        return;
    };
    let opened = &state.egress.allow_private;
    let bound = state
        .auth
        .network_bound(tenant)
        .and_then(|b| b.policy(opened).ok());
    for session in sessions.of_tenant(tenant) {
        let Some(policy) = session.network().and_then(|n| n.policy(opened).ok()) else {
            continue;
        };
        if let Some(proxy) = &*session.egress.lock().unwrap_or_else(|e| e.into_inner()) {
            proxy.replace(policy, bound.clone());
        }
    }
}

/// Finds a caller's live session; another tenant's id answers 404 as an unknown one.
pub fn lookup(state: &AppState, caller: &Caller, id: &str) -> Result<Arc<Session>, ApiError> {
    let session = find(state, caller, id)?;
    session.touch();
    Ok(session)
}

/// [`lookup`] without counting as activity (for reads a monitor polls).
pub fn find(state: &AppState, caller: &Caller, id: &str) -> Result<Arc<Session>, ApiError> {
    match state.sessions().get(id) {
        Some(session)
            if session.tenant == caller.tenant && !session.deleted.load(Ordering::SeqCst) =>
        {
            Ok(session)
        }
        _ => Err(ApiError::not_found(format!("no session {id}"))),
    }
}

/// Ends the session when its sandbox exits by itself (init killed, OOM of init).
fn watch_exit(state: &AppState, session: &Arc<Session>) {
    let state = state.clone();
    let session = session.clone();
    let sandbox = session.sandbox();
    // Watched in the task (a pidfd opened there), not before answering the create.
    tokio::spawn(async move {
        if !sandbox.ended().await {
            return;
        }
        // Restore replaces the sandbox: only the current one's end matters.
        if !Arc::ptr_eq(&session.sandbox(), &sandbox) || session.deleted.load(Ordering::SeqCst) {
            return;
        }
        tracing::warn!(session = %session.id, "sandbox exited by itself; ending the session");
        let _ = delete(&state, &session).await;
        audit::record_system(
            &state,
            &session.tenant,
            Some(&session.id),
            "session.exited",
            serde_json::json!({}),
            "ok",
        )
        .await;
    });
}

/// Writes each session's last activity to its row when it has changed, so that a
/// restarted daemon measures idle time from the last request (not from the last
/// time the row was written, e.g. at creation) and keeps sessions in use.
async fn save_activity(state: &AppState) {
    let changed: Vec<(String, String)> = state
        .sessions()
        .all()
        .iter()
        .filter_map(|s| {
            let active = s.last_active.load(Ordering::Relaxed);
            (s.saved_active.swap(active, Ordering::Relaxed) != active)
                .then(|| (s.id.clone(), rfc3339(active)))
        })
        .collect();
    if changed.is_empty() {
        return;
    }
    let saved = state.db.save_last_active(changed).await;
    if let Err(e) = saved {
        tracing::warn!("cannot save session activity: {}", e.message);
    }
}

async fn reap_expired(state: &AppState) {
    let now = unix_now();
    for session in state.sessions().all() {
        let (expires_at, idle_timeout) = {
            let terms = session.terms();
            (terms.expires_at, terms.idle_timeout_seconds)
        };
        let expired = expires_at.is_some_and(|e| e <= now);
        let idle = !session.paused.load(Ordering::Relaxed)
            && idle_timeout
                .is_some_and(|s| now - session.last_active.load(Ordering::Relaxed) > s as i64)
            && session.gate.try_write().is_ok();
        let pause_for = session
            .request
            .pause_at_expiry
            .filter(|_| expired && !session.paused.load(Ordering::SeqCst));
        if let Some(keep) = pause_for {
            pause_at_expiry(state, &session, keep).await;
            continue;
        }
        if expired || idle {
            let reason = if expired { "ttl" } else { "idle" };
            tracing::info!(session = %session.id, "ending session: {reason}");
            let outcome = match delete(state, &session).await {
                Ok(()) => "ok",
                Err(e) => e.code.as_str(),
            };
            audit::record_system(
                state,
                &session.tenant,
                Some(&session.id),
                "session.expire",
                serde_json::json!({"reason": reason}),
                outcome,
            )
            .await;
        }
    }
}

/// Pauses a session at its TTL instead of ending it, and keeps it `keep` seconds
/// more, both audited as the daemon's. A failure leaves it to end at its TTL.
async fn pause_at_expiry(state: &AppState, session: &Arc<Session>, keep: u64) {
    let daemon = Caller {
        tenant: session.tenant.clone(),
        key_id: None,
        admin: false,
        frontend: crate::auth::Frontend::Daemon,
    };
    tracing::info!(session = %session.id, "pausing session: ttl");
    let kept = async {
        set_paused(state, &daemon, &session.id, true).await?;
        let update = UpdateSession {
            ttl_seconds: Some(keep),
            ..UpdateSession::default()
        };
        update_session(state, &daemon, &session.id, update).await
    }
    .await;
    if let Err(e) = kept {
        tracing::warn!(session = %session.id, "cannot pause at expiry, ending it: {}", e.message);
        let _ = delete(state, session).await;
        audit::record_system(
            state,
            &session.tenant,
            Some(&session.id),
            "session.expire",
            serde_json::json!({"reason": "ttl"}),
            "ok",
        )
        .await;
    }
}

/// The caller's live sessions whose metadata has every `(key, value)` of `wanted`,
/// oldest first.
pub fn list_sessions(
    state: &AppState,
    caller: &Caller,
    wanted: &[(String, String)],
) -> Result<Vec<SessionInfo>, ApiError> {
    for (key, _) in wanted {
        check_metadata_key(key)?;
    }
    let matches = |session: &Session| {
        let terms = session.terms();
        wanted
            .iter()
            .all(|(key, value)| terms.metadata.get(key) == Some(value))
    };
    Ok(state
        .sessions()
        .of_tenant(&caller.tenant)
        .iter()
        .filter(|s| matches(s))
        .map(|s| s.info())
        .collect())
}

/// One of the caller's live sessions (a read that counts as activity).
pub fn get_session(state: &AppState, caller: &Caller, id: &str) -> Result<SessionInfo, ApiError> {
    Ok(lookup(state, caller, id)?.info())
}

/// Changes a live session's terms ([`update_terms`]) and records it in the audit
/// log (`session.update`).
pub async fn update_session(
    state: &AppState,
    caller: &Caller,
    id: &str,
    update: UpdateSession,
) -> Result<SessionInfo, ApiError> {
    let detail = serde_json::json!({
        "ttl_seconds": update.ttl_seconds,
        "idle_timeout_seconds": update.idle_timeout_seconds,
        "metadata": update.metadata,
        "network": update.network,
    });
    let result = update_terms(state, caller, id, update).await;
    let outcome = audit::outcome(&result);
    audit::record(state, caller, Some(id), "session.update", detail, outcome).await;
    result
}

/// Checks `update`, writes it to the session's row, then applies it: what a client
/// was told survives a daemon killed right after, and a refusal changes nothing.
async fn update_terms(
    state: &AppState,
    caller: &Caller,
    id: &str,
    update: UpdateSession,
) -> Result<SessionInfo, ApiError> {
    if update == UpdateSession::default() {
        return Err(ApiError::invalid(
            "nothing to change: give ttl_seconds, idle_timeout_seconds, metadata or network",
        ));
    }
    if let Some(ttl) = update.ttl_seconds {
        check_ttl(ttl)?;
    }
    if let Some(idle) = update.idle_timeout_seconds {
        check_idle_timeout(idle)?;
    }
    if let Some(metadata) = &update.metadata {
        check_metadata(metadata)?;
    }
    // Checked whole before anything changes: a bad policy leaves the old in force.
    let network = match &update.network {
        Some(network) => {
            let network = network.normalized()?;
            let policies = crate::egress::policies(state, &caller.tenant, &network)?;
            Some((network, policies))
        }
        None => None,
    };
    let session = lookup(state, caller, id)?;
    let _updating = session.updating.lock().await;
    let mut terms = session.terms().clone();
    if let Some(ttl) = update.ttl_seconds {
        terms.expires_at = Some(unix_now() + ttl as i64);
    }
    if let Some(idle) = update.idle_timeout_seconds {
        terms.idle_timeout_seconds = (idle > 0).then_some(idle);
    }
    if let Some(metadata) = update.metadata {
        terms.metadata = metadata;
    }
    if let Some((asked, _)) = &network {
        match &terms.network {
            Some(_) => terms.network = Some(asked.clone()),
            None if asked.is_none() => {}
            None => {
                return Err(ApiError::conflict(format!(
                    "session {id} was started without a network (mode \"none\"), so it has no \
                     way out to open; create a session with a network mode"
                )))
            }
        }
    }
    let updated = state
        .db
        .update_session_terms(
            session.id.clone(),
            (
                terms.expires_at.map(rfc3339),
                terms.idle_timeout_seconds.map(|s| s as i64),
            ),
            terms.stored_request(&session.request)?,
            terms.stored_network()?,
        )
        .await?;
    // Deleted (or expired) meanwhile.
    if updated == 0 || session.deleted.load(Ordering::SeqCst) {
        return Err(ApiError::not_found(format!("no session {id}")));
    }
    // New connections are decided by the new policy from here; open ones go on.
    if let (Some((_, policies)), Some(proxy)) = (
        network,
        &*session.egress.lock().unwrap_or_else(|e| e.into_inner()),
    ) {
        proxy.replace(policies.0, policies.1);
    }
    *session.terms() = terms;
    Ok(session.info())
}

/// Ends one of the caller's sessions and records it in the audit log
/// (`session.delete`).
pub async fn delete_session(state: &AppState, caller: &Caller, id: &str) -> Result<(), ApiError> {
    let result = match lookup(state, caller, id) {
        // Finished even if the caller goes away.
        Ok(session) => {
            let task_state = state.clone();
            tokio::spawn(async move { delete(&task_state, &session).await })
                .await
                .map_err(ApiError::internal)
                .and_then(|r| r)
        }
        Err(e) => Err(e),
    };
    let outcome = audit::outcome(&result);
    let detail = serde_json::json!({});
    audit::record(state, caller, Some(id), "session.delete", detail, outcome).await;
    result
}

/// Pauses (freezes) or resumes one of the caller's sessions, and records it in the
/// audit log (`session.pause`, `session.resume`).
pub async fn set_paused(
    state: &AppState,
    caller: &Caller,
    id: &str,
    paused: bool,
) -> Result<SessionInfo, ApiError> {
    let result = async {
        let session = lookup(state, caller, id)?;
        let _gate = session.gate.write().await;
        ensure_not_deleted(&session)?;
        freeze(&session, paused).await?;
        session.paused.store(paused, Ordering::SeqCst);
        persist(state, &session, if paused { "paused" } else { "running" }).await?;
        Ok(session.info())
    }
    .await;
    let action = if paused {
        "session.pause"
    } else {
        "session.resume"
    };
    let outcome = audit::outcome(&result);
    audit::record(
        state,
        caller,
        Some(id),
        action,
        serde_json::json!({}),
        outcome,
    )
    .await;
    result
}

pub async fn freeze(session: &Session, frozen: bool) -> Result<(), ApiError> {
    session.sandbox().freeze(frozen).await
}

/// The session must be running (not paused) for execs and file writes.
pub fn ensure_running(session: &Session) -> Result<(), ApiError> {
    if session.paused.load(Ordering::SeqCst) {
        return Err(ApiError::conflict(format!(
            "session {} is paused; resume it first",
            session.id
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(id: &str) -> Held {
        Held::Snapshot {
            tenant: "t".into(),
            id: id.into(),
        }
    }

    /// A delete closes first, then waits for the claims made before: a claim made
    /// after the close sees it, and the wait ends when the last earlier claim does.
    #[tokio::test]
    async fn a_delete_waits_for_earlier_claims_and_later_claims_see_it_closing() {
        let holds = Holds::default();
        let earlier = holds.claim(vec![snapshot("a")]).await;
        let other = holds.claim(vec![snapshot("b")]).await;
        let closing = holds.close(snapshot("a")).await;
        let later = holds.claim(vec![snapshot("a")]).await;
        assert!(holds.is_closing(&snapshot("a")));
        assert!(!holds.is_closing(&snapshot("b")));
        drop(later);

        let a = snapshot("a");
        let settled = holds.settled(&a);
        tokio::pin!(settled);
        let waited =
            tokio::time::timeout(std::time::Duration::from_millis(50), settled.as_mut()).await;
        assert!(waited.is_err(), "settled with a claim still held");
        drop(earlier);
        tokio::time::timeout(std::time::Duration::from_secs(5), settled)
            .await
            .expect("still waiting after the last claim ended");
        // Another thing's claim does not hold it up, and the close ends with its guard.
        assert_eq!(holds.pending(&snapshot("b")), 1);
        drop(closing);
        assert!(!holds.is_closing(&snapshot("a")));
        drop(other);
    }
}
