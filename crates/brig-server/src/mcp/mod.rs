//! The MCP front end: brig's sandbox as tools for agents (Claude Code, Cursor, ...),
//! served with the official Rust SDK (`rmcp`): streamable HTTP at the daemon's
//! `/mcp` ([`http`]) and stdio for `brig mcp` ([`serve_stdio`]).
//!
//! Each MCP session gets one sandbox of its own, made on its first tool call and
//! deleted when the session ends. Where the tools' work is done is a [`Workspace`]:
//! the engine in this process ([`EngineWorkspace`]), or, for `brig mcp` against a
//! running daemon, that daemon's REST API (in the CLI). The tools (`tools.rs`) only
//! parse arguments, call the workspace and encode its answers.

use std::borrow::Cow;
use std::future::Future;
use std::sync::Arc;

use brig_engine::auth::Caller;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, Implementation, ListToolsResult,
    PaginatedRequestParams, ProtocolVersion, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};

mod engine;
pub mod http;
mod tools;

pub use brig_engine::interpreter::CodeSummary;
pub use engine::EngineWorkspace;

/// What a command run by `run_command` did.
#[derive(Debug, Clone, Default)]
pub struct CommandOutput {
    /// `None` when it was killed by a signal.
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub stdout: String,
    pub stderr: String,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
}

/// Why a tool's work failed: the daemon's stable code (docs/API.md) and its
/// one-line message, from the engine here or from a daemon's REST API.
#[derive(Debug, Clone)]
pub struct Failure {
    pub code: String,
    pub message: String,
}

impl From<brig_engine::fault::Error> for Failure {
    fn from(e: brig_engine::fault::Error) -> Failure {
        Failure {
            code: e.code.as_str().to_string(),
            message: e.message,
        }
    }
}

/// One entry of `list_files`.
#[derive(Debug, Clone)]
pub struct Entry {
    pub name: String,
    /// "file", "directory", "symlink" or "other".
    pub kind: String,
    pub size_bytes: u64,
}

/// The sandbox of one MCP session, as the tools use it. `caller` is who made the
/// request when the transport says (HTTP: the request's API key); a workspace that
/// serves one caller only (stdio) ignores it. Paths are absolute. Errors carry the
/// daemon's stable codes.
pub trait Workspace: Send + Sync + 'static {
    fn run_command(
        &self,
        caller: Option<Caller>,
        command: String,
        timeout_ms: Option<u64>,
    ) -> impl Future<Output = Result<CommandOutput, Failure>> + Send;

    /// Writes `content` to `path` (parents made); the bytes written.
    fn write_file(
        &self,
        caller: Option<Caller>,
        path: String,
        content: String,
    ) -> impl Future<Output = Result<u64, Failure>> + Send;

    /// The file at `path`: `Ok(Err(size))` when it is larger than `limit` bytes.
    fn read_file(
        &self,
        caller: Option<Caller>,
        path: String,
        limit: u64,
    ) -> impl Future<Output = Result<Result<Vec<u8>, u64>, Failure>> + Send;

    fn list_files(
        &self,
        caller: Option<Caller>,
        path: String,
    ) -> impl Future<Output = Result<Vec<Entry>, Failure>> + Send;

    /// Runs Python `code` in the sandbox's stateful interpreter (its default
    /// context: variables, imports and the working directory stay between calls).
    fn run_code(
        &self,
        caller: Option<Caller>,
        code: String,
        timeout_ms: Option<u64>,
    ) -> impl Future<Output = Result<CodeSummary, Failure>> + Send;

    /// Saves what the sandbox's files are now as a snapshot, deleted with the
    /// MCP session; its id.
    fn snapshot(
        &self,
        caller: Option<Caller>,
        name: Option<String>,
    ) -> impl Future<Output = Result<String, Failure>> + Send;

    /// Puts the sandbox's files back as snapshot `snapshot_id` holds them (its
    /// processes and the interpreter's state start afresh).
    fn restore(
        &self,
        caller: Option<Caller>,
        snapshot_id: String,
    ) -> impl Future<Output = Result<(), Failure>> + Send;

    /// Deletes the sandbox, if one was made: the MCP session is over.
    fn close(&self) -> impl Future<Output = ()> + Send;
}

/// The MCP server of one MCP session over workspace `W`.
pub struct Brig<W> {
    workspace: Arc<W>,
}

impl<W> Clone for Brig<W> {
    fn clone(&self) -> Self {
        Brig {
            workspace: self.workspace.clone(),
        }
    }
}

impl<W: Workspace> Brig<W> {
    pub fn new(workspace: W) -> Brig<W> {
        Brig {
            workspace: Arc::new(workspace),
        }
    }

    pub fn workspace(&self) -> &W {
        &self.workspace
    }
}

const INSTRUCTIONS: &str = "brig gives you a Linux sandbox of your own for this session: \
    run shell commands in it and read, write and list its files. It starts empty on \
    your first tool call, keeps its files between calls, and is deleted when the \
    session ends. Nothing you do in it reaches the host; its network is limited by \
    the operator's policy. Put your work under /workspace (the working directory).";

impl<W: Workspace> ServerHandler for Brig<W> {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("brig", env!("CARGO_PKG_VERSION")))
            .with_instructions(INSTRUCTIONS)
    }

    /// Only the revisions with an `initialize` handshake: they have sessions, and a
    /// sandbox lives as long as its session (the 2026-07-28 revision has none).
    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(ProtocolVersion::known_up_to(
            &ProtocolVersion::LATEST_WITH_INITIALIZE,
        ))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(tools::list()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        // Over HTTP, the request's caller (its API key), which `http` put there.
        let caller = context
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<Caller>().cloned());
        let arguments = request.arguments.unwrap_or_default();
        tools::call(&*self.workspace, caller, &request.name, &arguments)
            .await
            .map(Into::into)
    }
}

/// Serves MCP on stdin/stdout until the client closes stdin, then deletes the
/// session's sandbox.
pub async fn serve_stdio<W: Workspace>(workspace: W) -> anyhow::Result<()> {
    use rmcp::ServiceExt;
    let server = Brig::new(workspace);
    let running = server
        .clone()
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| anyhow::anyhow!("MCP over stdio: {e}"))?;
    let ended = running.waiting().await;
    server.workspace().close().await;
    ended
        .map(|_| ())
        .map_err(|e| anyhow::anyhow!("MCP over stdio: {e}"))
}

/// `brig mcp` with no daemon configured: the engine runs in this process, on the
/// data dir `args` names, for one caller (the default tenant, as `--no-auth`
/// serves), until the client closes stdin. Then the sandbox is deleted and the
/// engine stopped as `brig serve` stops it.
pub async fn serve_stdio_in_process(args: crate::ServeArgs) -> anyhow::Result<()> {
    let mut config = crate::config::Config::from(args);
    config.no_auth = true;
    let state = crate::server::start(config).await?;
    crate::server::spawn_background(&state, crate::filestore::EXPIRY_INTERVAL);
    let mut caller = state
        .auth
        .authenticate(None)
        .await
        .map_err(|e| anyhow::anyhow!("{}", e.message))?;
    caller.frontend = brig_engine::auth::Frontend::Mcp;
    let result = serve_stdio(EngineWorkspace::new(state.clone(), Some(caller))).await;
    state.begin_shutdown();
    brig_engine::boot::stop(&state).await;
    result
}
