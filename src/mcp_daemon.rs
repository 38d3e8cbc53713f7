//! `brig mcp` against a running daemon (`BRIG_URL` / `BRIG_API_KEY`, as the other
//! client subcommands): the MCP session's sandbox is a session on that daemon,
//! made on the first tool call and deleted when the client closes stdin; each tool
//! is a call to the daemon's REST API (the client of `client_cmd`, blocking, on
//! tokio's blocking threads).

use std::io::Read;
use std::sync::Arc;

use brig_server::auth::Caller;
use brig_server::mcp::{CommandOutput, Entry, Failure, Workspace};
use serde_json::{json, Value};

use crate::client_cmd::{seg, session_path, ApiError, Client};

pub struct DaemonWorkspace {
    client: Arc<Client>,
    /// The session's `image` and `network`, as the API takes them.
    create: Value,
    session: tokio::sync::Mutex<Option<String>>,
    /// The snapshots `snapshot` took: checkpoints of this MCP session, deleted
    /// with it.
    snapshots: std::sync::Mutex<Vec<String>>,
}

impl DaemonWorkspace {
    pub fn new(client: Client, image: Option<String>, network: Option<Value>) -> DaemonWorkspace {
        let mut create = json!({"metadata": {"frontend": "mcp"}});
        if let Some(image) = image {
            create["image"] = json!(image);
        }
        if let Some(network) = network {
            create["network"] = network;
        }
        DaemonWorkspace {
            client: Arc::new(client),
            create,
            session: tokio::sync::Mutex::new(None),
            snapshots: std::sync::Mutex::default(),
        }
    }

    async fn blocking<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Client) -> anyhow::Result<T> + Send + 'static,
    ) -> Result<T, Failure> {
        let client = self.client.clone();
        tokio::task::spawn_blocking(move || work(&client))
            .await
            .map_err(|e| failure(e.into()))?
            .map_err(failure)
    }

    /// [`Self::blocking`] on session `id`: when the daemon says it is gone (its TTL
    /// or idle timeout ended it), the next call makes a new one.
    async fn on_session<T: Send + 'static>(
        &self,
        id: &str,
        work: impl FnOnce(&Client) -> anyhow::Result<T> + Send + 'static,
    ) -> Result<T, Failure> {
        let result = self.blocking(work).await;
        if let Err(e) = &result {
            // A not_found may name something else (a snapshot): only a session
            // the daemon no longer has is replaced.
            let path = session_path(id, "");
            let gone = e.code == "not_found"
                && self
                    .blocking(move |client| client.get_json(&path))
                    .await
                    .is_err_and(|lookup| lookup.code == "not_found");
            let mut slot = self.session.lock().await;
            if gone && slot.as_deref() == Some(id) {
                *slot = None;
                return Err(Failure {
                    code: e.code.clone(),
                    message: "this session's sandbox is gone (it expired, or was deleted): \
                        the next call starts a new, empty one"
                        .to_string(),
                });
            }
        }
        result
    }

    async fn session(&self) -> Result<String, Failure> {
        let mut slot = self.session.lock().await;
        if let Some(id) = &*slot {
            return Ok(id.clone());
        }
        let body = self.create.clone();
        let created = self
            .blocking(move |client| client.post_json("/v1/sessions", &body))
            .await?;
        let id = created["session_id"]
            .as_str()
            .ok_or_else(|| failure(anyhow::anyhow!("the daemon's answer has no session_id")))?
            .to_string();
        *slot = Some(id.clone());
        Ok(id)
    }
}

/// The daemon's code and message; a failure to reach it is `unavailable`.
fn failure(e: anyhow::Error) -> Failure {
    match e.downcast_ref::<ApiError>() {
        Some(api) => Failure {
            code: api.code.clone(),
            message: api.message.clone(),
        },
        None => Failure {
            code: "unavailable".into(),
            message: format!("{e:#}"),
        },
    }
}

fn with_path(id: &str, rest: &str, path: &str) -> String {
    format!("{}?path={}", session_path(id, rest), seg(path))
}

impl Workspace for DaemonWorkspace {
    async fn snapshot(
        &self,
        _caller: Option<Caller>,
        name: Option<String>,
    ) -> Result<String, Failure> {
        let id = self.session().await?;
        let path = session_path(&id, "/snapshots");
        let body = json!({"name": name});
        let r = self
            .on_session(&id, move |client| client.post_json(&path, &body))
            .await?;
        let snapshot_id = r["snapshot_id"]
            .as_str()
            .map(String::from)
            .ok_or_else(|| Failure {
                code: "internal".into(),
                message: "the daemon's answer to a snapshot has no snapshot_id".into(),
            })?;
        self.snapshots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(snapshot_id.clone());
        Ok(snapshot_id)
    }

    async fn restore(&self, _caller: Option<Caller>, snapshot_id: String) -> Result<(), Failure> {
        let id = self.session().await?;
        let path = session_path(&id, "/restore");
        let body = json!({"snapshot_id": snapshot_id});
        self.on_session(&id, move |client| client.post_json(&path, &body))
            .await
            .map(|_| ())
    }

    async fn run_code(
        &self,
        _caller: Option<Caller>,
        code: String,
        timeout_ms: Option<u64>,
    ) -> Result<brig_server::mcp::CodeSummary, Failure> {
        let id = self.session().await?;
        let mut body = json!({"code": code});
        if let Some(timeout_ms) = timeout_ms {
            body["timeout_ms"] = json!(timeout_ms);
        }
        let path = session_path(&id, "/code");
        let r = self
            .on_session(&id, move |client| client.post_json(&path, &body))
            .await?;
        serde_json::from_value(r).map_err(|e| Failure {
            code: "internal".into(),
            message: format!("the daemon's answer to run_code: {e}"),
        })
    }

    async fn run_command(
        &self,
        _caller: Option<Caller>,
        command: String,
        timeout_ms: Option<u64>,
    ) -> Result<CommandOutput, Failure> {
        let id = self.session().await?;
        let mut body = json!({"cmd": command});
        if let Some(timeout_ms) = timeout_ms {
            body["timeout_ms"] = json!(timeout_ms);
        }
        let path = session_path(&id, "/exec");
        let r = self
            .on_session(&id, move |client| client.post_json(&path, &body))
            .await?;
        let text = |key: &str| r[key].as_str().unwrap_or_default().to_string();
        let flag = |key: &str| r[key].as_bool().unwrap_or(false);
        let number = |key: &str| r[key].as_i64().and_then(|n| i32::try_from(n).ok());
        Ok(CommandOutput {
            exit_code: number("exit_code"),
            signal: number("signal"),
            timed_out: flag("timed_out"),
            stdout: text("stdout"),
            stderr: text("stderr"),
            stdout_truncated: flag("stdout_truncated"),
            stderr_truncated: flag("stderr_truncated"),
        })
    }

    async fn write_file(
        &self,
        _caller: Option<Caller>,
        path: String,
        content: String,
    ) -> Result<u64, Failure> {
        let id = self.session().await?;
        let len = content.len() as u64;
        let url = with_path(&id, "/files", &path);
        self.on_session(&id, move |client| {
            client.check(client.put(&url).send(content.into_bytes()))?;
            Ok(len)
        })
        .await
    }

    async fn read_file(
        &self,
        _caller: Option<Caller>,
        path: String,
        limit: u64,
    ) -> Result<Result<Vec<u8>, u64>, Failure> {
        let id = self.session().await?;
        let url = with_path(&id, "/files", &path);
        self.on_session(&id, move |client| {
            let response = client.check(client.get(&url).call())?;
            let mut bytes = Vec::new();
            response
                .into_body()
                .into_reader()
                .take(limit + 1)
                .read_to_end(&mut bytes)?;
            Ok(if bytes.len() as u64 > limit {
                Err(bytes.len() as u64)
            } else {
                Ok(bytes)
            })
        })
        .await
    }

    async fn list_files(
        &self,
        _caller: Option<Caller>,
        path: String,
    ) -> Result<Vec<Entry>, Failure> {
        let id = self.session().await?;
        let url = with_path(&id, "/dir", &path);
        let listing = self
            .on_session(&id, move |client| client.get_json(&url))
            .await?;
        let entries = listing["entries"].as_array().cloned().unwrap_or_default();
        Ok(entries
            .iter()
            .map(|e| Entry {
                name: e["name"].as_str().unwrap_or_default().to_string(),
                kind: e["kind"].as_str().unwrap_or("other").to_string(),
                size_bytes: e["size_bytes"].as_u64().unwrap_or(0),
            })
            .collect())
    }

    async fn close(&self) {
        if let Some(id) = self.session.lock().await.take() {
            let deleted = self
                .blocking(move |client| client.delete_ok(&session_path(&id, "")))
                .await;
            if let Err(e) = deleted {
                tracing::warn!(code = %e.code, "cannot delete the MCP session's sandbox: {}", e.message);
            }
        }
        let snapshots =
            std::mem::take(&mut *self.snapshots.lock().unwrap_or_else(|p| p.into_inner()));
        for snapshot_id in snapshots {
            let path = format!("/v1/snapshots/{}", seg(&snapshot_id));
            match self.blocking(move |client| client.delete_ok(&path)).await {
                Ok(()) => {}
                Err(e) if e.code == "not_found" => {}
                Err(e) => {
                    tracing::warn!(code = %e.code, "cannot delete the MCP session's snapshot: {}", e.message)
                }
            }
        }
    }
}
