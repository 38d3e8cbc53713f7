//! A backend for the engine's own tests: no root, no process started. A sandbox's
//! root is a plain directory in its session's directory; exec runs a tiny
//! interpreter in the daemon (`echo`, `exit N`, `sleep S`, `cat`, `pwd`, `true`,
//! `false`, joined by `;`), writing to the stdio the engine hands over, so the
//! engine's exec path (pipes, output limits, timeouts, permits) runs for real.
//! [`Knobs`] make launches fail or take time, to provoke races.

mod link;

use std::any::Any;
use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use brig_jail::agent::JobExit;
use brig_jail::cgroup::{Cgroup, CgroupStats, CgroupUsage};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use link::FakeLink;

use super::{Backend, BoxFuture, Captured, Facts, Launch, Link, Sandbox};
use crate::fault::Error as ApiError;
use crate::rootfs::{Direct, Filler, RootfsError, SandboxRoot};

/// What a test controls of the fake, and what it counts.
#[derive(Default)]
pub struct Knobs {
    /// The next this many launches fail (`internal`).
    pub fail_launches: AtomicU64,
    /// Every launch takes this long (milliseconds) before it starts anything.
    pub launch_delay_ms: AtomicU64,
    /// Freezing fails (`conflict`) while set.
    pub fail_freeze: AtomicBool,
    pub launched: AtomicU64,
}

#[derive(Default)]
pub struct Fake {
    pub knobs: Arc<Knobs>,
    next: AtomicU64,
    /// Every sandbox started, by number: a re-attach finds it here (a sandbox
    /// destroyed, or of another process, is found dead).
    sandboxes: Mutex<HashMap<u64, Arc<State>>>,
}

impl Fake {
    pub fn new() -> Arc<Fake> {
        Arc::new(Fake::default())
    }

    /// Sandboxes started and not destroyed.
    pub fn alive(&self) -> usize {
        let all = self.sandboxes.lock().unwrap_or_else(|e| e.into_inner());
        all.values()
            .filter(|s| s.alive.load(Ordering::SeqCst))
            .count()
    }

    /// Jobs running in all sandboxes.
    pub fn running(&self) -> usize {
        let all = self.sandboxes.lock().unwrap_or_else(|e| e.into_inner());
        all.values()
            .map(|s| {
                let jobs = s.jobs.lock().unwrap_or_else(|e| e.into_inner());
                jobs.by_id
                    .values()
                    .filter(|j| j.exit.borrow().is_none())
                    .count()
            })
            .sum()
    }

    /// Ends sandbox `number` by itself, as an init killed from outside would.
    pub fn kill(&self, number: u64) {
        let all = self.sandboxes.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(state) = all.get(&number) {
            state.end();
        }
    }
}

/// The number of a fake sandbox (for [`Fake::kill`]).
pub fn number_of(sandbox: &dyn Sandbox) -> Option<u64> {
    sandbox
        .as_any()
        .downcast_ref::<FakeSandbox>()
        .map(|s| s.record.number)
}

/// A fake sandbox's stored runtime.
#[derive(Clone, Serialize, Deserialize)]
struct Record {
    number: u64,
    root: PathBuf,
    image: Option<String>,
    process_base: u64,
}

/// What the engine holds of one fake sandbox.
pub struct FakeSandbox {
    record: Record,
    facts: Facts,
    state: Arc<State>,
    knobs: Arc<Knobs>,
}

/// The sandbox itself, shared by its handles and connections.
struct State {
    alive: AtomicBool,
    ended: watch::Sender<bool>,
    frozen: AtomicBool,
    jobs: Mutex<Jobs>,
}

#[derive(Default)]
struct Jobs {
    next: u64,
    by_id: HashMap<u64, Job>,
}

struct Job {
    exit: watch::Receiver<Option<JobExit>>,
    kill: Option<tokio::sync::oneshot::Sender<i32>>,
}

impl State {
    fn new() -> Arc<State> {
        Arc::new(State {
            alive: AtomicBool::new(true),
            ended: watch::channel(false).0,
            frozen: AtomicBool::new(false),
            jobs: Mutex::new(Jobs::default()),
        })
    }

    fn end(&self) {
        self.alive.store(false, Ordering::SeqCst);
        let mut jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        for job in jobs.by_id.values_mut() {
            if let Some(kill) = job.kill.take() {
                let _ = kill.send(libc::SIGKILL);
            }
        }
        drop(jobs);
        self.ended.send_replace(true);
    }

    fn signal(&self, job: u64, signal: i32) -> bool {
        let mut jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        match jobs.by_id.get_mut(&job) {
            Some(job) => {
                if let Some(kill) = job.kill.take() {
                    let _ = kill.send(signal);
                }
                true
            }
            None => false,
        }
    }
}

impl Backend for Fake {
    fn kind(&self) -> &'static str {
        "fake"
    }

    fn prepare(&self) -> anyhow::Result<()> {
        Ok(())
    }

    fn launch(&self, launch: Launch) -> BoxFuture<'_, Result<Arc<dyn Sandbox>, ApiError>> {
        Box::pin(async move {
            let delay = self.knobs.launch_delay_ms.load(Ordering::SeqCst);
            if delay > 0 {
                tokio::time::sleep(Duration::from_millis(delay)).await;
            }
            let failing =
                self.knobs
                    .fail_launches
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
            if failing.is_ok() {
                return Err(ApiError::internal("fake: launch failed as asked"));
            }
            let number = self.next.fetch_add(1, Ordering::SeqCst) + 1;
            let root = launch.dir.join(format!("root-{number}"));
            for dir in ["workspace", "tmp"] {
                std::fs::create_dir_all(root.join(dir)).map_err(ApiError::internal)?;
            }
            let record = Record {
                number,
                root,
                image: launch.image,
                process_base: launch.process_base,
            };
            let state = State::new();
            self.sandboxes
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(number, state.clone());
            self.knobs.launched.fetch_add(1, Ordering::SeqCst);
            Ok(FakeSandbox::handle(record, state, &self.knobs))
        })
    }

    fn reattach(&self, runtime: &str) -> Option<Arc<dyn Sandbox>> {
        let record: Record = serde_json::from_str(runtime).ok()?;
        let known = self
            .sandboxes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&record.number)
            .cloned();
        let state = known.unwrap_or_else(|| {
            let dead = State::new();
            dead.end();
            dead
        });
        Some(FakeSandbox::handle(record, state, &self.knobs))
    }

    fn sweep<'a>(&'a self, _: &'a Path, _: Option<&'a dyn Sandbox>) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }
}

impl FakeSandbox {
    fn handle(record: Record, state: Arc<State>, knobs: &Arc<Knobs>) -> Arc<dyn Sandbox> {
        let facts = Facts {
            enforced: serde_json::json!({"backend": "fake"}),
            env: vec![("PATH".into(), "/bin".into())],
            cwd: brig_policy::defaults::WORKSPACE.to_string(),
            image: record.image.clone(),
            placeholders: Vec::new(),
            process_base: record.process_base,
        };
        Arc::new(FakeSandbox {
            record,
            facts,
            state,
            knobs: knobs.clone(),
        })
    }
}

impl Sandbox for FakeSandbox {
    fn facts(&self) -> &Facts {
        &self.facts
    }

    fn runtime(&self) -> Result<String, ApiError> {
        serde_json::to_string(&self.record).map_err(ApiError::internal)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn is_alive(&self) -> bool {
        self.state.alive.load(Ordering::SeqCst)
    }

    fn reachable(&self) -> bool {
        self.is_alive()
    }

    fn ended(&self) -> BoxFuture<'static, bool> {
        let mut ended = self.state.ended.subscribe();
        Box::pin(async move { ended.wait_for(|e| *e).await.is_ok() })
    }

    fn destroy(&self) -> BoxFuture<'static, Result<(), String>> {
        let state = self.state.clone();
        Box::pin(async move {
            state.end();
            Ok(())
        })
    }

    fn forget(&self) -> BoxFuture<'static, ()> {
        let root = self.record.root.clone();
        Box::pin(async move {
            let _ = tokio::fs::remove_dir_all(root).await;
        })
    }

    fn freeze(&self, frozen: bool) -> BoxFuture<'static, Result<(), ApiError>> {
        let state = self.state.clone();
        let fail = self.knobs.fail_freeze.load(Ordering::SeqCst);
        Box::pin(async move {
            if fail {
                return Err(ApiError::conflict("fake: freezing failed as asked"));
            }
            if !state.alive.load(Ordering::SeqCst) {
                return Err(ApiError::conflict("fake: the sandbox has ended"));
            }
            state.frozen.store(frozen, Ordering::SeqCst);
            Ok(())
        })
    }

    fn to_foreground(&self) -> Result<(), String> {
        Ok(())
    }

    fn moved_to(&self, dir: &Path) -> Arc<dyn Sandbox> {
        let mut record = self.record.clone();
        if let Some(name) = record.root.file_name() {
            record.root = dir.join(name);
        }
        Arc::new(FakeSandbox {
            record,
            facts: self.facts.clone(),
            state: self.state.clone(),
            knobs: self.knobs.clone(),
        })
    }

    fn connect(&self) -> io::Result<Box<dyn Link>> {
        if !self.is_alive() {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionRefused,
                "fake: the sandbox has ended",
            ));
        }
        Ok(Box::new(FakeLink::new(self.state.clone())))
    }

    fn root(&self) -> Result<SandboxRoot, RootfsError> {
        let uid = rustix::process::geteuid().as_raw();
        let gid = rustix::process::getegid().as_raw();
        SandboxRoot::open(&self.record.root, uid, gid)
    }

    fn file_user(&self) -> Option<(u32, u32)> {
        None
    }

    fn filler(&self, _: Duration) -> io::Result<Box<dyn Filler + Send>> {
        Ok(Box::new(Direct::new()))
    }

    fn capture_writes(&self, _: bool) -> BoxFuture<'_, Result<Captured, ApiError>> {
        Box::pin(async { Err(ApiError::conflict("fake: sandboxes take no snapshots")) })
    }

    fn stats(&self) -> (CgroupStats, CgroupUsage) {
        Default::default()
    }

    fn oom_kills(&self) -> Option<u64> {
        None
    }

    fn lock_scope(&self) -> Option<(&Cgroup, i32)> {
        None
    }

    fn charge_to(&self) -> Vec<PathBuf> {
        Vec::new()
    }
}
