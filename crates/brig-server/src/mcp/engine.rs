//! An MCP session's sandbox on the engine in this process: the daemon's `/mcp`, and
//! `brig mcp` when no daemon is configured. Every verb is the engine's, called as
//! front end `mcp`, so the audit log tells an agent's work from the REST API's.

use std::collections::BTreeMap;

use brig_engine::auth::{Caller, Frontend};
use brig_engine::fault::{Error, ErrorCode};
use brig_engine::sessions::exec::{self, ExecRequest};
use brig_engine::sessions::{self, files, CreateSession};
use brig_engine::state::AppState;
use tokio::io::AsyncReadExt;

use super::{CommandOutput, Entry, Failure, Workspace};

/// The sandbox of one MCP session: made on the first tool call, by and for the
/// tenant of the key that made it; deleted by [`Workspace::close`], or when this is
/// dropped (the session ended without a close: an HTTP session that expired).
pub struct EngineWorkspace {
    state: AppState,
    /// The caller when the transport names none (stdio).
    owner: Option<Caller>,
    /// The session's id and the caller that made it.
    session: tokio::sync::Mutex<Option<(String, Caller)>>,
    /// The snapshots `snapshot` took, and by whom: checkpoints of this MCP
    /// session, deleted with it.
    snapshots: std::sync::Mutex<Vec<(String, Caller)>>,
    runtime: tokio::runtime::Handle,
}

impl EngineWorkspace {
    /// A workspace on `state` for `owner` (stdio), or for the callers each request
    /// names (HTTP: `None`). Called within the runtime that will delete it.
    pub fn new(state: AppState, owner: Option<Caller>) -> EngineWorkspace {
        EngineWorkspace {
            state,
            owner,
            session: tokio::sync::Mutex::new(None),
            snapshots: std::sync::Mutex::default(),
            runtime: tokio::runtime::Handle::current(),
        }
    }

    /// The session's id, made now if this is the first call, and the caller to
    /// make this call as. Another tenant's key gets the engine's 404 on every verb:
    /// the session is looked up under the caller's tenant.
    async fn session(&self, caller: Option<Caller>) -> Result<(String, Caller), Error> {
        let mut caller = caller
            .or_else(|| self.owner.clone())
            .ok_or_else(|| Error::unauthorized("no caller for this MCP request"))?;
        caller.frontend = Frontend::Mcp;
        let mut slot = self.session.lock().await;
        if let Some((id, _)) = &*slot {
            return Ok((id.clone(), caller));
        }
        let args = &self.state.args;
        let request = CreateSession {
            image: args.mcp_image.clone(),
            network: args.mcp_network.clone(),
            metadata: Some(BTreeMap::from([("frontend".into(), "mcp".into())])),
            ..CreateSession::default()
        };
        let info = sessions::create_session(&self.state, &caller, request).await?;
        *slot = Some((info.session_id.clone(), caller.clone()));
        Ok((info.session_id, caller))
    }

    /// A verb's outcome. When it says the session is gone (its TTL or idle timeout
    /// ended it, or the REST API deleted it), the next call makes a new sandbox
    /// rather than failing for the rest of the MCP session.
    async fn check<T>(
        &self,
        id: &str,
        caller: &Caller,
        result: Result<T, Error>,
    ) -> Result<T, Failure> {
        let e = match result {
            Ok(value) => return Ok(value),
            Err(e) => e,
        };
        // A verb's not_found may name something else (a snapshot, a context): only
        // a session that is really gone is replaced.
        let gone = e.code == ErrorCode::NotFound
            && sessions::lookup(&self.state, caller, id)
                .is_err_and(|lookup| lookup.code == ErrorCode::NotFound);
        if gone {
            let mut slot = self.session.lock().await;
            // Not for another tenant's key, which is told not_found for a live one.
            if slot
                .as_ref()
                .is_some_and(|(held, owner)| held == id && owner.tenant == caller.tenant)
            {
                *slot = None;
                return Err(Failure {
                    code: e.code.as_str().to_string(),
                    message: "this session's sandbox is gone (it expired, or was deleted): \
                        the next call starts a new, empty one"
                        .to_string(),
                });
            }
        }
        Err(e.into())
    }
}

impl Workspace for EngineWorkspace {
    async fn snapshot(
        &self,
        caller: Option<Caller>,
        name: Option<String>,
    ) -> Result<String, Failure> {
        let (id, caller) = self.session(caller).await?;
        let taken = brig_engine::sessions::snapshots::create(&self.state, &caller, &id, name).await;
        let snapshot_id = self.check(&id, &caller, taken).await?.snapshot_id;
        self.snapshots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((snapshot_id.clone(), caller));
        Ok(snapshot_id)
    }

    async fn restore(&self, caller: Option<Caller>, snapshot_id: String) -> Result<(), Failure> {
        let (id, caller) = self.session(caller).await?;
        let restored =
            brig_engine::sessions::snapshots::restore(&self.state, &caller, &id, &snapshot_id)
                .await;
        self.check(&id, &caller, restored).await.map(|_| ())
    }

    async fn run_code(
        &self,
        caller: Option<Caller>,
        code: String,
        timeout_ms: Option<u64>,
    ) -> Result<brig_engine::interpreter::CodeSummary, Failure> {
        let (id, caller) = self.session(caller).await?;
        let request = brig_engine::interpreter::RunCode {
            code,
            context_id: None,
            timeout_ms,
            ..Default::default()
        };
        let ran =
            brig_engine::interpreter::run_code_summary(&self.state, &caller, &id, request).await;
        self.check(&id, &caller, ran).await
    }

    async fn run_command(
        &self,
        caller: Option<Caller>,
        command: String,
        timeout_ms: Option<u64>,
    ) -> Result<CommandOutput, Failure> {
        let (id, caller) = self.session(caller).await?;
        let request = ExecRequest {
            cmd: Some(command),
            timeout_ms,
            ..ExecRequest::default()
        };
        let ran = exec::exec(&self.state, &caller, &id, &request).await;
        let (result, _slot) = self.check(&id, &caller, ran).await?;
        Ok(CommandOutput {
            exit_code: result.exit_code,
            signal: result.signal,
            timed_out: result.timed_out,
            stdout: result.stdout,
            stderr: result.stderr,
            stdout_truncated: result.stdout_truncated,
            stderr_truncated: result.stderr_truncated,
        })
    }

    async fn write_file(
        &self,
        caller: Option<Caller>,
        path: String,
        content: String,
    ) -> Result<u64, Failure> {
        let (id, caller) = self.session(caller).await?;
        let body = std::io::Cursor::new(content.into_bytes());
        let written = files::write(&self.state, &caller, &id, &path, body).await;
        let written = self.check(&id, &caller, written).await?;
        Ok(written.size_bytes)
    }

    async fn read_file(
        &self,
        caller: Option<Caller>,
        path: String,
        limit: u64,
    ) -> Result<Result<Vec<u8>, u64>, Failure> {
        let (id, caller) = self.session(caller).await?;
        let read = files::read(&self.state, &caller, &id, &path).await;
        let read = self.check(&id, &caller, read).await?;
        if read.size_bytes > limit {
            return Ok(Err(read.size_bytes));
        }
        let mut bytes = Vec::new();
        // The size may have grown since: never more than the limit.
        read.file
            .take(limit + 1)
            .read_to_end(&mut bytes)
            .await
            .map_err(Error::internal)?;
        if bytes.len() as u64 > limit {
            return Ok(Err(bytes.len() as u64));
        }
        Ok(Ok(bytes))
    }

    async fn list_files(
        &self,
        caller: Option<Caller>,
        path: String,
    ) -> Result<Vec<Entry>, Failure> {
        let (id, caller) = self.session(caller).await?;
        // The listing comes back whole; the body the engine would stream is empty.
        let (tx, rx) = tokio::sync::oneshot::channel();
        let body = files::list(&self.state, &caller, &id, &path, move |listing, _| {
            let _ = tx.send(listing);
            Ok(())
        })
        .await;
        let mut body = self.check(&id, &caller, body).await?;
        let mut rest = Vec::new();
        body.read_to_end(&mut rest).await.map_err(Error::internal)?;
        let listing = rx
            .await
            .map_err(|_| Error::internal("the listing was not made"))?;
        Ok(listing
            .entries
            .into_iter()
            .map(|e| Entry {
                name: e.name,
                kind: e.kind,
                size_bytes: e.size_bytes,
            })
            .collect())
    }

    async fn close(&self) {
        let taken = self.session.lock().await.take();
        if let Some((id, caller)) = taken {
            delete(&self.state, &caller, &id).await;
        }
        let snapshots =
            std::mem::take(&mut *self.snapshots.lock().unwrap_or_else(|p| p.into_inner()));
        delete_snapshots(&self.state, snapshots).await;
    }
}

impl Drop for EngineWorkspace {
    fn drop(&mut self) {
        let session = self.session.get_mut().take();
        let snapshots = std::mem::take(self.snapshots.get_mut().unwrap_or_else(|p| p.into_inner()));
        if session.is_some() || !snapshots.is_empty() {
            let state = self.state.clone();
            self.runtime.spawn(async move {
                if let Some((id, caller)) = session {
                    delete(&state, &caller, &id).await;
                }
                delete_snapshots(&state, snapshots).await;
            });
        }
    }
}

/// The session's checkpoints, once its sandbox is gone (a restored sandbox runs
/// from its snapshot until then).
async fn delete_snapshots(state: &AppState, snapshots: Vec<(String, Caller)>) {
    for (snapshot_id, caller) in snapshots {
        match brig_engine::sessions::snapshots::delete(state, &caller, &snapshot_id).await {
            Ok(()) => {}
            Err(e) if e.code == ErrorCode::NotFound => {}
            Err(e) => tracing::warn!(
                snapshot = snapshot_id,
                error = %e.message,
                "cannot delete an MCP session's snapshot"
            ),
        }
    }
}

async fn delete(state: &AppState, caller: &Caller, id: &str) {
    match sessions::delete_session(state, caller, id).await {
        Ok(()) => tracing::info!(session = id, "MCP session ended: its sandbox is deleted"),
        // Already gone (expired, or deleted through the REST API).
        Err(e) if e.code.as_str() == "not_found" => {}
        Err(e) => {
            tracing::warn!(session = id, error = %e.message, "cannot delete an MCP session's sandbox")
        }
    }
}
