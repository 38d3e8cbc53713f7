//! The namespace backend: sandboxes started by the launch helper ([`launch`]), each served by its init over a socket in its session's
//! directory; files reached through `/proc/<init>/root`, accounting through the
//! sandbox's cgroup.

pub mod agent;
pub mod copy_in;
pub mod launch;

use std::any::Any;
use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use brig_jail::agent::{AgentReply, AgentRequest};
use brig_jail::cgroup::{Cgroup, CgroupStats, CgroupUsage};

use super::{Backend, BoxFuture, Captured, Facts, Launch, Link, Sandbox};
use crate::fault::Error as ApiError;
use crate::rootfs::{Filler, RootfsError, SandboxRoot};
use agent::Agent;
use copy_in::CopyIn;
use launch::Launched;

pub struct Namespaces {
    store: PathBuf,
    id_range: Option<(u32, u32)>,
    zygote: launch::ZygoteSlot,
}

impl Namespaces {
    pub fn new(config: &crate::Config) -> Namespaces {
        Namespaces {
            store: config.store.clone(),
            id_range: config.id_range.map(|r| (r.start, r.end)),
            zygote: launch::ZygoteSlot::default(),
        }
    }
}

/// A started sandbox: its launch record, and what the engine reads of it.
pub struct NsSandbox {
    launched: Launched,
    facts: Facts,
}

impl NsSandbox {
    pub fn new(launched: Launched) -> NsSandbox {
        let facts = Facts {
            enforced: launched.enforced.clone(),
            env: launched.env.clone(),
            cwd: launched.cwd.clone(),
            image: launched.image.clone(),
            placeholders: launched.placeholders.clone(),
            process_base: launched.process_base,
        };
        NsSandbox { launched, facts }
    }
}

impl Backend for Namespaces {
    fn kind(&self) -> &'static str {
        super::BackendKind::Namespaces.as_str()
    }

    fn prepare(&self) -> anyhow::Result<()> {
        brig_jail::session::become_subreaper()?;
        raise_nofile();
        Ok(())
    }

    fn launch(&self, launch: Launch) -> BoxFuture<'_, Result<Arc<dyn Sandbox>, ApiError>> {
        Box::pin(async move {
            let process_base = launch.process_base;
            let mut launched =
                launch::start_sandbox(&self.store, self.id_range, &self.zygote, launch).await?;
            launched.process_base = process_base;
            Ok(Arc::new(NsSandbox::new(launched)) as Arc<dyn Sandbox>)
        })
    }

    fn shutdown(&self) {
        self.zygote.stop();
    }

    fn reattach(&self, runtime: &str) -> Option<Arc<dyn Sandbox>> {
        let launched: Launched = serde_json::from_str(runtime).ok()?;
        Some(Arc::new(NsSandbox::new(launched)))
    }

    fn sweep<'a>(&'a self, dir: &'a Path, current: Option<&'a dyn Sandbox>) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let current = current
                .and_then(|s| s.as_any().downcast_ref::<NsSandbox>())
                .map(|s| launch::record_path(&s.launched.control_socket));
            let records = std::fs::read_dir(dir)
                .into_iter()
                .flatten()
                .flatten()
                .map(|entry| entry.path())
                .filter(|p| p.extension().is_some_and(|e| e == "json"));
            for record in records {
                if current.as_ref() == Some(&record) {
                    continue;
                }
                let path = record.clone();
                let found = tokio::task::spawn_blocking(move || launch::read_record(&path))
                    .await
                    .ok()
                    .flatten();
                if let Some(launched) = found {
                    if launched.handle.is_alive() {
                        tracing::info!(dir = %dir.display(), "destroying a sandbox the previous daemon started but never stored");
                    }
                    let handle = launched.handle;
                    let _ = tokio::task::spawn_blocking(move || handle.destroy()).await;
                }
                let _ = std::fs::remove_file(record.with_extension("sock"));
                let _ = std::fs::remove_file(&record);
            }
        })
    }
}

impl Sandbox for NsSandbox {
    fn facts(&self) -> &Facts {
        &self.facts
    }

    fn runtime(&self) -> Result<String, ApiError> {
        serde_json::to_string(&self.launched).map_err(ApiError::internal)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn is_alive(&self) -> bool {
        self.launched.handle.is_alive()
    }

    fn reachable(&self) -> bool {
        self.launched.handle.is_alive() && self.launched.control_socket.exists()
    }

    fn ended(&self) -> BoxFuture<'static, bool> {
        let handle = self.launched.handle.clone();
        Box::pin(async move {
            match handle.pidfd() {
                Ok(Some(pidfd)) => {
                    let Ok(fd) = agent::register(pidfd) else {
                        return false;
                    };
                    let _ = fd.readable().await;
                    brig_jail::session::reap(fd.get_ref());
                    true
                }
                // Gone already, since it was started or re-attached.
                Ok(None) => true,
                Err(_) => false,
            }
        })
    }

    fn destroy(&self) -> BoxFuture<'static, Result<(), String>> {
        let handle = self.launched.handle.clone();
        Box::pin(async move {
            match tokio::task::spawn_blocking(move || handle.destroy()).await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(e.to_string()),
                Err(e) => Err(format!("cleanup task: {e}")),
            }
        })
    }

    fn forget(&self) -> BoxFuture<'static, ()> {
        let socket = self.launched.control_socket.clone();
        Box::pin(async move {
            let _ = tokio::fs::remove_file(&socket).await;
            let _ = tokio::fs::remove_file(launch::record_path(&socket)).await;
        })
    }

    fn freeze(&self, frozen: bool) -> BoxFuture<'static, Result<(), ApiError>> {
        let handle = self.launched.handle.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || handle.freeze(frozen))
                .await
                .map_err(ApiError::internal)?
                .map_err(|e| ApiError::conflict(e.to_string()))
        })
    }

    fn to_foreground(&self) -> Result<(), String> {
        self.launched
            .handle
            .to_foreground()
            .map_err(|e| e.to_string())
    }

    fn moved_to(&self, dir: &Path) -> Arc<dyn Sandbox> {
        let mut launched = self.launched.clone();
        if let Some(name) = launched.control_socket.file_name() {
            launched.control_socket = dir.join(name);
        }
        Arc::new(NsSandbox::new(launched))
    }

    fn connect(&self) -> io::Result<Box<dyn Link>> {
        Ok(Box::new(Agent::connect(&self.launched.control_socket)?))
    }

    fn root(&self) -> Result<SandboxRoot, RootfsError> {
        let handle = &self.launched.handle;
        SandboxRoot::open(
            Path::new(&format!("/proc/{}/root", handle.pid)),
            handle.host_uid,
            handle.host_gid,
        )
    }

    fn file_user(&self) -> Option<(u32, u32)> {
        Some((self.launched.handle.host_uid, self.launched.handle.host_gid))
    }

    fn filler(&self, idle: std::time::Duration) -> io::Result<Box<dyn Filler + Send>> {
        Ok(Box::new(CopyIn::connect(
            &self.launched.control_socket,
            idle,
        )?))
    }

    fn capture_writes(&self, upper: bool) -> BoxFuture<'_, Result<Captured, ApiError>> {
        Box::pin(async move {
            let request = if upper {
                AgentRequest::Upper
            } else {
                AgentRequest::Scratch
            };
            let (reply, fds) = agent::call(&self.launched.control_socket, &request)
                .await
                .map_err(crate::sessions::exec::sandbox_gone)?;
            match reply {
                AgentReply::Done if fds.len() == 1 => Ok(Captured::Upper(
                    fds.into_iter().next().expect("one descriptor"),
                )),
                AgentReply::Scratch { names } if names.len() == fds.len() && !fds.is_empty() => {
                    Ok(Captured::Scratch(names.into_iter().zip(fds).collect()))
                }
                AgentReply::Error { message } => Err(ApiError::conflict(message)),
                other => Err(ApiError::internal(format!(
                    "unexpected agent reply {other:?} with {} descriptors",
                    fds.len()
                ))),
            }
        })
    }

    fn stats(&self) -> (CgroupStats, CgroupUsage) {
        let handle = &self.launched.handle;
        (
            handle.stats().unwrap_or_default(),
            handle.usage().unwrap_or_default(),
        )
    }

    fn oom_kills(&self) -> Option<u64> {
        self.launched.handle.oom_kills()
    }

    fn bind_net(
        &self,
        listen: &[brig_jail::net::Listen],
        capture: Option<brig_jail::net::Capture>,
    ) -> Result<Vec<OwnedFd>, String> {
        let handle = &self.launched.handle;
        // Checked first: a pid that no longer names init may name another process.
        if !handle.is_alive() {
            return Err("the sandbox has ended".into());
        }
        brig_jail::net::bind_in_namespace_of(handle.pid, listen, capture).map_err(|e| e.to_string())
    }

    fn lock_scope(&self) -> Option<(&Cgroup, i32)> {
        let handle = &self.launched.handle;
        handle.cgroup.as_ref().map(|c| (c, handle.pid))
    }

    fn charge_to(&self) -> Vec<PathBuf> {
        match &self.launched.handle.cgroup {
            Some(cgroup) => cgroup.procs_files(),
            None => Vec::new(),
        }
    }
}

impl Link for Agent {
    fn send<'a>(
        &'a self,
        request: &'a AgentRequest,
        fds: &'a [BorrowedFd<'a>],
    ) -> BoxFuture<'a, io::Result<()>> {
        Box::pin(Agent::send(self, request, fds))
    }

    fn recv(&mut self) -> BoxFuture<'_, io::Result<(AgentReply, Vec<OwnedFd>)>> {
        Box::pin(Agent::recv(self))
    }
}

/// Each live session costs the daemon a descriptor (its exit watcher) and each exec
/// a few more: lift the soft limit (often 1024) to the hard one.
fn raise_nofile() {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        let raised = Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        if let Err(e) = setrlimit(Resource::Nofile, raised) {
            tracing::warn!("cannot raise the open-file limit: {e}");
        }
    }
}
