//! The warm pool: sandboxes started ahead of demand, per image, so that creating a
//! session that asks for nothing special is a rename and a row instead of a launch.
//!
//! A pooled sandbox belongs to no tenant and has run nothing. Its directory is
//! renamed to the new session's (a bound unix socket moves with its directory), and
//! its row is re-keyed. Pool sandboxes have rows too (state `pooled`), so a daemon
//! that dies leaves nothing its successor does not clean up at start.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{launch_sandbox, session_dir, CreateSession};
use crate::backend::Sandbox;
use crate::config::Config;
// The domain error; the front ends decide how it is answered.
use crate::fault::Error as ApiError;
use crate::state::{AppState, Shared};

/// How often the filler checks the pool when nothing wakes it.
const REFILL_INTERVAL: Duration = Duration::from_millis(500);
/// How long after the last take the filler waits before launching a replacement. A
/// launch is several milliseconds of kernel work (namespaces, mounts, cgroups) that
/// idle priority does not make preemptible, a session just taken is about to run its
/// first exec, and creates come in bursts: so the pool refills after a burst of
/// creates, not during it. Other requests (polls, health checks) do not hold it up.
const QUIET: Duration = Duration::from_millis(100);
/// Pause after a failed launch, so a broken image does not spin.
const FAILURE_BACKOFF: Duration = Duration::from_secs(5);

/// The pool key: an image name, or `None` for the host's system dirs.
type Key = Option<String>;

pub struct Pool {
    targets: Vec<(Key, usize)>,
    ready: Mutex<HashMap<Key, Vec<Ready>>>,
    wake: tokio::sync::Notify,
    /// Held by the filler from a launch until its sandbox is in `ready`, and by
    /// `drain`: a launch under way at shutdown is drained too, not left running.
    filling: tokio::sync::Mutex<()>,
    /// When a sandbox was last taken, in nanoseconds since `epoch`.
    last_take: AtomicU64,
    epoch: Instant,
}

/// A started sandbox waiting for a session.
pub struct Ready {
    id: String,
    launched: Arc<dyn Sandbox>,
}

impl Pool {
    pub fn new(args: &Config) -> Pool {
        Pool {
            targets: args
                .pool
                .iter()
                .map(|(image, n)| {
                    let key = (image != "host").then(|| image.clone());
                    (key, *n)
                })
                .collect(),
            ready: Mutex::new(HashMap::new()),
            wake: tokio::sync::Notify::new(),
            filling: tokio::sync::Mutex::new(()),
            last_take: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }

    fn since_last_take(&self) -> Duration {
        let last = Duration::from_nanos(self.last_take.load(Ordering::Relaxed));
        self.epoch.elapsed().saturating_sub(last)
    }

    /// Takes a ready sandbox for `image`, if any; the filler starts a replacement.
    pub fn take(&self, image: Option<&str>) -> Option<Ready> {
        let key = image.map(str::to_string);
        let taken = self
            .ready
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(&key)
            .and_then(|list| list.pop());
        if taken.is_some() {
            let now = self.epoch.elapsed().as_nanos() as u64;
            self.last_take.fetch_max(now, Ordering::Relaxed);
            self.wake.notify_one();
            crate::metrics::set_pool(image.unwrap_or("host"), self.size(&key) as f64);
        }
        taken
    }

    /// Waits until no sandbox has been taken for [`QUIET`], but not once a pool is
    /// low (less than half its target ready): a burst has gone on long enough to
    /// drain it then, and the next creates would go cold, which costs each of them
    /// far more than sharing the machine with a launch.
    async fn quiet(&self) {
        loop {
            let since = self.since_last_take();
            if since >= QUIET || self.low() {
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep(QUIET - since) => {}
                // Another take: it may have made the pool low.
                _ = self.wake.notified() => {}
            }
        }
    }

    fn low(&self) -> bool {
        self.targets
            .iter()
            .any(|(key, target)| self.size(key) * 2 < *target)
    }

    fn size(&self, key: &Key) -> usize {
        self.ready
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .map_or(0, Vec::len)
    }

    /// Ready sandboxes per image, for the API and metrics.
    pub fn sizes(&self) -> Vec<(String, usize)> {
        self.targets
            .iter()
            .map(|(key, _)| (key.clone().unwrap_or_else(|| "host".into()), self.size(key)))
            .collect()
    }
}

/// Whether a request can be served from the pool: nothing about the sandbox itself
/// differs from the pool's (env and files are applied per exec and after taking).
pub fn fits(request: &CreateSession, limits: &brig_policy::Limits) -> bool {
    request.snapshot.is_none()
        && request.mounts.as_ref().is_none_or(Vec::is_empty)
        && request.volume.is_none()
        // Pooled sandboxes were started without the link, as the default user.
        && request.home.is_none()
        && request.user.is_none()
        && *limits == super::base_spec().limits
}

impl Ready {
    /// Makes the sandbox session `id`'s: moves its directory. Returns the sandbox and
    /// the id of its pool row, which the caller replaces with the session's row (in
    /// one transaction). A daemon killed in between leaves a pool row whose socket is
    /// gone, which the next start destroys, as any pool row, and then the directory
    /// (known to no row).
    pub async fn adopt(
        self,
        shared: &Shared,
        id: &str,
    ) -> Result<(Arc<dyn Sandbox>, String), ApiError> {
        // Filled at idle priority; a session's execs run at normal priority.
        if let Err(e) = self.launched.to_foreground() {
            self.destroy(shared).await;
            return Err(ApiError::internal(format!("adopt pooled sandbox: {e}")));
        }
        let from = session_dir(shared, &self.id);
        let to = session_dir(shared, id);
        // A rename within one directory: a synchronous call is cheaper than a hop to
        // the blocking pool.
        if let Err(e) = std::fs::rename(&from, &to) {
            self.destroy(shared).await;
            return Err(ApiError::internal(format!("adopt pooled sandbox: {e}")));
        }
        Ok((self.launched.moved_to(&to), self.id))
    }

    /// Destroys the sandbox, its directory and its row.
    async fn destroy(self, shared: &Shared) {
        let _ = self.launched.destroy().await;
        let _ = tokio::fs::remove_dir_all(session_dir(shared, &self.id)).await;
        let _ = shared.db.delete_session_row(&self.id).await;
    }
}

/// Keeps every pool at its target size, one launch at a time (launches are
/// CPU-bound: doing them in parallel would only slow the API).
pub fn spawn_filler(state: &AppState) {
    if state.sessions().pool.targets.is_empty() {
        return;
    }
    let state = state.clone();
    tokio::spawn(async move {
        // Stops at shutdown: `drain` empties the pool, after the launch under way.
        while !state.is_shutting_down() {
            let mut launched_any = false;
            let targets = state.sessions().pool.targets.clone();
            for (key, target) in targets {
                let pool = &state.sessions().pool;
                if pool.size(&key) >= target {
                    continue;
                }
                pool.quiet().await;
                let filled = {
                    let _filling = pool.filling.lock().await;
                    if state.is_shutting_down() {
                        return;
                    }
                    fill_one(&state, key.clone()).await.map(|ready| {
                        let mut map = pool.ready.lock().unwrap_or_else(|e| e.into_inner());
                        map.entry(key.clone()).or_default().push(ready);
                        map.get(&key).map_or(0, Vec::len)
                    })
                };
                match filled {
                    Ok(n) => {
                        crate::metrics::set_pool(key.as_deref().unwrap_or("host"), n as f64);
                        launched_any = true;
                    }
                    Err(e) => {
                        tracing::warn!(image = ?key, "warm pool: cannot start a sandbox: {}", e.message);
                        tokio::time::sleep(FAILURE_BACKOFF).await;
                    }
                }
            }
            if !launched_any {
                let pool = &state.sessions().pool;
                let _ = tokio::time::timeout(REFILL_INTERVAL, pool.wake.notified()).await;
            }
        }
    });
}

async fn fill_one(state: &AppState, image: Key) -> Result<Ready, ApiError> {
    let id = format!("pool_{}", crate::auth::random_hex(12));
    let request = CreateSession::default();
    let limits = super::limits_of(&request)?;
    let spec = super::spec_for(state, "", &request, &limits)?;
    // At idle priority until taken: a refill then never slows the creates and execs
    // it runs beside. Root only: an unprivileged daemon could not raise it again.
    let background = rustix::process::geteuid().is_root();
    let launched = launch_sandbox(state, &id, spec, image.clone(), None, background).await?;
    let runtime = launched.runtime()?;
    let now = crate::db::now_rfc3339();
    let stored = state
        .db
        .insert_pooled_session(id.clone(), image, runtime, state.backend.kind(), now)
        .await;
    if let Err(e) = stored {
        let _ = launched.destroy().await;
        let _ = tokio::fs::remove_dir_all(session_dir(state, &id)).await;
        return Err(e);
    }
    Ok(Ready { id, launched })
}

/// Destroys every pooled sandbox (at shutdown, once shutdown has begun: the filler
/// launches nothing after this).
pub async fn drain(state: &AppState) {
    let pool = &state.sessions().pool;
    let _filling = pool.filling.lock().await;
    let all: Vec<Ready> = pool
        .ready
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .drain()
        .flat_map(|(_, list)| list)
        .collect();
    for ready in all {
        ready.destroy(state).await;
    }
}
