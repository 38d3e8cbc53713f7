//! The tools: their descriptions (read by a model deciding what to call), their
//! arguments, and their answers as MCP content. A tool that ran and failed (a bad
//! argument, a missing file, a command that exited non-zero) answers a tool error
//! (`isError`), which the model reads; protocol errors are for unknown tools only.
//!
//! A tool is one entry in [`list`] and one arm in [`call`].

use brig_engine::auth::Caller;
use rmcp::model::{CallToolResult, ContentBlock, JsonObject, Tool, ToolAnnotations};
use rmcp::ErrorData;
use serde_json::{json, Value};

use super::{CommandOutput, Entry, Failure, Workspace};

/// The most `read_file` returns: a model reads it all, and more is rarely useful.
pub const READ_LIMIT: u64 = 1 << 20;

/// Where a relative path is resolved: the sandbox's working directory.
const WORKDIR: &str = "/workspace";

fn schema(value: Value) -> JsonObject {
    match value {
        Value::Object(object) => object,
        _ => unreachable!("a schema is an object"),
    }
}

fn tool(name: &'static str, description: &'static str, input: Value) -> Tool {
    Tool::new(name, description, schema(input))
}

pub fn list() -> Vec<Tool> {
    vec![
        tool(
            "run_command",
            "Run a shell command (`sh -c`) in your sandbox and wait for it to end. \
             Returns its exit code, stdout and stderr; a command that fails (non-zero \
             exit, killed, timed out) is reported as an error with its output. The \
             working directory is /workspace; files persist between calls. Use it to \
             install packages, run programs and tests, move files.",
            json!({
                "type": "object",
                "properties": {
                    "command": {"type": "string", "description": "The command line, e.g. `ls -la` or `python3 main.py`."},
                    "timeout_ms": {"type": "integer", "minimum": 1, "description": "Kill the command after this many milliseconds (default and maximum: the server's limit, usually 60000)."}
                },
                "required": ["command"],
                "additionalProperties": false
            }),
        )
        .with_annotations(ToolAnnotations::new().destructive(true).open_world(true)),
        tool(
            "write_file",
            "Write a text file in your sandbox, replacing it if it exists; missing \
             parent directories are made. Paths are absolute or relative to /workspace.",
            json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "Where to write, e.g. `main.py` or `/workspace/src/app.py`."},
                    "content": {"type": "string", "description": "The whole content of the file (UTF-8 text)."}
                },
                "required": ["path", "content"],
                "additionalProperties": false
            }),
        )
        .with_annotations(ToolAnnotations::new().destructive(true).idempotent(true)),
        tool(
            "read_file",
            "Read a text file from your sandbox (at most 1 MiB; for larger files use \
             run_command with head, tail or grep). A binary file is reported as such \
             rather than shown. Paths are absolute or relative to /workspace.",
            json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "The file to read, e.g. `output.txt`."}
                },
                "required": ["path"],
                "additionalProperties": false
            }),
        )
        .with_annotations(ToolAnnotations::new().read_only(true)),
        tool(
            "list_files",
            "List a directory in your sandbox: one entry per line, directories with a \
             trailing `/`, files with their size. Paths are absolute or relative to \
             /workspace (default: /workspace).",
            json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "The directory to list (default: /workspace)."}
                },
                "additionalProperties": false
            }),
        )
        .with_annotations(ToolAnnotations::new().read_only(true)),
        tool(
            "run_code",
            "Run Python code in your sandbox's stateful interpreter: variables, imports \
             and functions stay defined between calls, like cells of a notebook. \
             Returns what it printed and the value of its last expression; \
             matplotlib figures come back as images (no savefig needed), pandas \
             tables as text. An exception is reported as an error with its traceback; \
             the state stays. The working directory is /workspace.",
            json!({
                "type": "object",
                "properties": {
                    "code": {"type": "string", "description": "Python source, e.g. `import pandas as pd\\ndf = pd.read_csv('data.csv')\\ndf.describe()`."},
                    "timeout_ms": {"type": "integer", "minimum": 1, "description": "Interrupt the code (KeyboardInterrupt, state kept) after this many milliseconds (default and maximum: the server's limit, usually 60000)."}
                },
                "required": ["code"],
                "additionalProperties": false
            }),
        )
        .with_annotations(ToolAnnotations::new().destructive(true).open_world(true)),
        tool(
            "snapshot",
            "Save a checkpoint of your sandbox's files (/workspace, /tmp and anything \
             else written), to go back to with `restore` before trying something risky. \
             Returns the snapshot's id. Running processes and the Python interpreter's \
             variables are not saved. Checkpoints last as long as this session.",
            json!({
                "type": "object",
                "properties": {
                    "name": {"type": "string", "description": "A name to remember it by, e.g. `before-upgrade`."}
                },
                "additionalProperties": false
            }),
        )
        .with_annotations(ToolAnnotations::new().destructive(false)),
        tool(
            "restore",
            "Put your sandbox's files back exactly as a snapshot saved them: what was \
             written since is gone. Running processes end and the Python interpreter \
             starts afresh.",
            json!({
                "type": "object",
                "properties": {
                    "snapshot_id": {"type": "string", "description": "The id `snapshot` returned."}
                },
                "required": ["snapshot_id"],
                "additionalProperties": false
            }),
        )
        .with_annotations(ToolAnnotations::new().destructive(true).idempotent(true)),
    ]
}

/// Runs tool `name`. Errors of the tool's own are its result (`isError`).
pub async fn call<W: Workspace>(
    workspace: &W,
    caller: Option<Caller>,
    name: &str,
    arguments: &JsonObject,
) -> Result<CallToolResult, ErrorData> {
    let result = match name {
        "run_command" => run_command(workspace, caller, arguments).await,
        "write_file" => write_file(workspace, caller, arguments).await,
        "read_file" => read_file(workspace, caller, arguments).await,
        "list_files" => list_files(workspace, caller, arguments).await,
        "run_code" => run_code(workspace, caller, arguments).await,
        "snapshot" => snapshot(workspace, caller, arguments).await,
        "restore" => restore(workspace, caller, arguments).await,
        _ => {
            return Err(ErrorData::invalid_params(
                format!("unknown tool {name:?}"),
                None,
            ))
        }
    };
    Ok(result.unwrap_or_else(failed))
}

fn failed(message: String) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(message)])
}

/// A failure from the sandbox, as the model reads it: the daemon's code and message.
fn refused(e: Failure) -> String {
    format!("{} ({})", e.message, e.code)
}

/// Arguments checked against the tool's parameters: each problem names the
/// argument.
struct Args<'a> {
    object: &'a JsonObject,
}

impl<'a> Args<'a> {
    fn new(object: &'a JsonObject, known: &[&str]) -> Result<Args<'a>, String> {
        if let Some(unknown) = object.keys().find(|k| !known.contains(&k.as_str())) {
            return Err(format!(
                "unknown argument `{unknown}`: this tool takes {}",
                known
                    .iter()
                    .map(|k| format!("`{k}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        Ok(Args { object })
    }

    fn string(&self, name: &str) -> Result<String, String> {
        self.optional_string(name)?
            .ok_or_else(|| format!("missing argument `{name}` (a string)"))
    }

    fn optional_string(&self, name: &str) -> Result<Option<String>, String> {
        match self.object.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(format!("argument `{name}` must be a string")),
        }
    }

    fn optional_u64(&self, name: &str) -> Result<Option<u64>, String> {
        match self.object.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(value) => match value.as_u64() {
                Some(n) if n > 0 => Ok(Some(n)),
                _ => Err(format!("argument `{name}` must be a positive integer")),
            },
        }
    }

    /// A path argument, absolute (a relative one is under /workspace). `..` and
    /// symlinks are left to the engine, which resolves them inside the sandbox.
    fn path(&self, name: &str, default: Option<&str>) -> Result<String, String> {
        let path = match (self.optional_string(name)?, default) {
            (Some(path), _) => path,
            (None, Some(default)) => default.to_string(),
            (None, None) => return Err(format!("missing argument `{name}` (a path)")),
        };
        if path.is_empty() || path.contains('\0') {
            return Err(format!("argument `{name}` must be a non-empty path"));
        }
        Ok(if path.starts_with('/') {
            path
        } else {
            format!("{WORKDIR}/{path}")
        })
    }
}

async fn run_command<W: Workspace>(
    workspace: &W,
    caller: Option<Caller>,
    arguments: &JsonObject,
) -> Result<CallToolResult, String> {
    let args = Args::new(arguments, &["command", "timeout_ms"])?;
    let command = args.string("command")?;
    if command.trim().is_empty() {
        return Err("argument `command` is empty".into());
    }
    let timeout_ms = args.optional_u64("timeout_ms")?;
    let output = workspace
        .run_command(caller, command, timeout_ms)
        .await
        .map_err(refused)?;
    Ok(command_result(&output))
}

/// The outcome first (what a model checks), then each stream under its name.
fn command_result(output: &CommandOutput) -> CallToolResult {
    let (status, ok) = match (output.timed_out, output.exit_code, output.signal) {
        (true, _, _) => ("timed out and was killed".to_string(), false),
        (false, Some(0), _) => ("exit code 0".to_string(), true),
        (false, Some(code), _) => (format!("command failed: exit code {code}"), false),
        (false, None, Some(signal)) => (format!("command killed by signal {signal}"), false),
        (false, None, None) => ("command ended without an exit code".to_string(), false),
    };
    let mut text = status;
    for (name, body, truncated) in [
        ("stdout", &output.stdout, output.stdout_truncated),
        ("stderr", &output.stderr, output.stderr_truncated),
    ] {
        text.push_str(&format!("\n--- {name} ---\n"));
        text.push_str(if body.is_empty() { "(empty)" } else { body });
        if truncated {
            text.push_str("\n(truncated: the output limit was reached)");
        }
    }
    let content = vec![ContentBlock::text(text)];
    if ok {
        CallToolResult::success(content)
    } else {
        CallToolResult::error(content)
    }
}

async fn write_file<W: Workspace>(
    workspace: &W,
    caller: Option<Caller>,
    arguments: &JsonObject,
) -> Result<CallToolResult, String> {
    let args = Args::new(arguments, &["path", "content"])?;
    let path = args.path("path", None)?;
    let content = args.string("content")?;
    let written = workspace
        .write_file(caller, path.clone(), content)
        .await
        .map_err(refused)?;
    Ok(CallToolResult::success(vec![ContentBlock::text(format!(
        "wrote {written} bytes to {path}"
    ))]))
}

async fn read_file<W: Workspace>(
    workspace: &W,
    caller: Option<Caller>,
    arguments: &JsonObject,
) -> Result<CallToolResult, String> {
    let args = Args::new(arguments, &["path"])?;
    let path = args.path("path", None)?;
    let bytes = match workspace
        .read_file(caller, path.clone(), READ_LIMIT)
        .await
        .map_err(refused)?
    {
        Ok(bytes) => bytes,
        Err(size) => {
            return Err(format!(
                "{path} is {size} bytes, more than read_file returns ({READ_LIMIT}); \
                 read parts of it with run_command (head, tail, sed -n, grep)"
            ))
        }
    };
    match String::from_utf8(bytes) {
        Ok(text) if !text.contains('\0') => {
            Ok(CallToolResult::success(vec![ContentBlock::text(text)]))
        }
        Ok(text) => Err(binary(&path, text.len())),
        Err(e) => Err(binary(&path, e.as_bytes().len())),
    }
}

fn binary(path: &str, size: usize) -> String {
    format!(
        "{path} is a binary file ({size} bytes), not shown: inspect it with run_command \
         (file, xxd, or a program that reads it)"
    )
}

async fn list_files<W: Workspace>(
    workspace: &W,
    caller: Option<Caller>,
    arguments: &JsonObject,
) -> Result<CallToolResult, String> {
    let args = Args::new(arguments, &["path"])?;
    let path = args.path("path", Some(WORKDIR))?;
    let mut entries = workspace
        .list_files(caller, path.clone())
        .await
        .map_err(refused)?;
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(CallToolResult::success(vec![ContentBlock::text(listing(
        &path, &entries,
    ))]))
}

fn listing(path: &str, entries: &[Entry]) -> String {
    if entries.is_empty() {
        return format!("{path} is empty");
    }
    entries
        .iter()
        .map(|e| match e.kind.as_str() {
            "directory" => format!("{}/", e.name),
            "file" => format!("{}  ({} bytes)", e.name, e.size_bytes),
            other => format!("{}  ({other})", e.name),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

async fn run_code<W: Workspace>(
    workspace: &W,
    caller: Option<Caller>,
    arguments: &JsonObject,
) -> Result<CallToolResult, String> {
    let args = Args::new(arguments, &["code", "timeout_ms"])?;
    let code = args.string("code")?;
    let timeout_ms = args.optional_u64("timeout_ms")?;
    let ran = workspace
        .run_code(caller, code, timeout_ms)
        .await
        .map_err(refused)?;
    Ok(code_result(&ran))
}

async fn snapshot<W: Workspace>(
    workspace: &W,
    caller: Option<Caller>,
    arguments: &JsonObject,
) -> Result<CallToolResult, String> {
    let args = Args::new(arguments, &["name"])?;
    let name = args.optional_string("name")?;
    let id = workspace.snapshot(caller, name).await.map_err(refused)?;
    Ok(CallToolResult::success(vec![ContentBlock::text(format!(
        "saved snapshot {id}: restore it with restore {{\"snapshot_id\": \"{id}\"}}"
    ))]))
}

async fn restore<W: Workspace>(
    workspace: &W,
    caller: Option<Caller>,
    arguments: &JsonObject,
) -> Result<CallToolResult, String> {
    let args = Args::new(arguments, &["snapshot_id"])?;
    let snapshot_id = args.string("snapshot_id")?;
    workspace
        .restore(caller, snapshot_id.clone())
        .await
        .map_err(refused)?;
    Ok(CallToolResult::success(vec![ContentBlock::text(format!(
        "restored the sandbox's files from snapshot {snapshot_id}"
    ))]))
}

/// Printed output first, then each result (text, or an image), then the error or
/// the timeout, which make it a tool error.
fn code_result(ran: &brig_engine::interpreter::CodeSummary) -> CallToolResult {
    let mut text = String::new();
    for (name, body, truncated) in [
        ("stdout", &ran.stdout, ran.stdout_truncated),
        ("stderr", &ran.stderr, ran.stderr_truncated),
    ] {
        if !body.is_empty() {
            text.push_str(&format!("--- {name} ---\n{body}"));
            if !body.ends_with('\n') {
                text.push('\n');
            }
            if truncated {
                text.push_str("(truncated: the output limit was reached)\n");
            }
        }
    }
    let mut images = Vec::new();
    for result in &ran.results {
        let data = &result.data;
        for mime in ["image/png", "image/jpeg", "image/svg+xml"] {
            if let Some(serde_json::Value::String(image)) = data.get(mime) {
                if mime == "image/svg+xml" {
                    text.push_str(&format!("--- result (svg) ---\n{image}\n"));
                } else {
                    images.push(ContentBlock::image(image.clone(), mime));
                }
            }
        }
        if let Some(plain) = data.get("text/plain").and_then(|v| v.as_str()) {
            let label = if result.main { "result" } else { "display" };
            text.push_str(&format!("--- {label} ---\n{plain}\n"));
        }
    }
    if ran.results_truncated {
        text.push_str("(more results were left out: the size limit was reached)\n");
    }
    let failed = if let Some(error) = &ran.error {
        text.push_str(&format!(
            "--- error ---\n{}: {}\n{}\n",
            error.name, error.value, error.traceback
        ));
        true
    } else if ran.timed_out {
        text.push_str(
            "--- timed out: the code was interrupted; the interpreter's state is kept ---\n",
        );
        true
    } else {
        false
    };
    if text.is_empty() {
        text = format!("ran (cell {}), no output", ran.execution_count);
    }
    let mut content = vec![ContentBlock::text(text)];
    content.extend(images);
    if failed {
        CallToolResult::error(content)
    } else {
        CallToolResult::success(content)
    }
}

#[cfg(test)]
#[path = "tools_tests.rs"]
mod tests;
