//! `brig mcp`: MCP over stdio, for agents that start their tools as processes
//! (`claude mcp add brig -- brig mcp`). A client of a running daemon when one is
//! configured (`--url`/`BRIG_URL`, `--api-key`/`BRIG_API_KEY`: see `mcp_daemon`);
//! otherwise it runs the engine in this process, on a data dir of its own. The MCP
//! server itself is brig-server's (`brig_server::mcp`).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use crate::client_cmd::ConnArgs;
use crate::EXIT_BRIG_ERROR;

#[derive(Args)]
pub struct McpArgs {
    #[command(flatten)]
    conn: ConnArgs,
    /// The image of the session's sandbox [default: the host's read-only system dirs].
    #[arg(long, value_name = "NAME")]
    image: Option<String>,
    /// The sandbox's network policy, as `brig serve --session-network`'s, e.g.
    /// '{"mode":"allow","allow":["pypi.org:443"]}' [default: none].
    #[arg(long, value_name = "JSON")]
    network: Option<String>,
    /// Without a daemon: the engine's state [default: $XDG_DATA_HOME/brig, else
    /// ~/.local/share/brig].
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Without a daemon: the image store [default: brig serve's].
    #[arg(long, value_name = "DIR")]
    store: Option<PathBuf>,
}

/// `$XDG_DATA_HOME/brig`, else `~/.local/share/brig`.
fn default_data_dir() -> Option<PathBuf> {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(dir) = var("XDG_DATA_HOME") {
        return Some(PathBuf::from(dir).join("brig"));
    }
    var("HOME").map(|home| PathBuf::from(home).join(".local/share/brig"))
}

/// Whether a daemon is configured: a URL or a key, by flag or in the environment.
fn daemon_configured(conn: &ConnArgs) -> bool {
    let set = |name: &str| std::env::var_os(name).is_some_and(|v| !v.is_empty());
    conn.url.is_some() || conn.api_key.is_some() || set("BRIG_URL") || set("BRIG_API_KEY")
}

fn runtime() -> Option<tokio::runtime::Runtime> {
    match tokio::runtime::Builder::new_multi_thread()
        .max_blocking_threads(brig_server::BLOCKING_THREADS)
        .enable_all()
        .build()
    {
        Ok(runtime) => Some(runtime),
        Err(e) => {
            eprintln!("brig: cannot start the runtime: {e}");
            None
        }
    }
}

fn finish(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("brig: {e:#}");
            ExitCode::from(EXIT_BRIG_ERROR)
        }
    }
}

pub fn main(args: McpArgs) -> ExitCode {
    if daemon_configured(&args.conn) {
        return through_daemon(args);
    }
    let Some(data_dir) = args.data_dir.or_else(default_data_dir) else {
        eprintln!("brig: no data dir: set HOME or XDG_DATA_HOME, or give --data-dir");
        return ExitCode::from(EXIT_BRIG_ERROR);
    };
    // The daemon's own flags: whatever brig serve checks is checked here the same way.
    // No /v1/execute here: its image need not exist.
    let mut argv: Vec<std::ffi::OsString> =
        vec!["brig mcp".into(), "--default-image".into(), "host".into()];
    argv.push("--data-dir".into());
    argv.push(data_dir.into());
    if let Some(store) = args.store {
        argv.extend(["--store".into(), store.into()]);
    }
    if let Some(image) = args.image {
        argv.extend(["--mcp-image".into(), image.into()]);
    }
    if let Some(network) = args.network {
        argv.extend(["--mcp-network".into(), network.into()]);
    }
    let serve = match brig_server::ServeArgs::try_parse_from(argv) {
        Ok(serve) => serve,
        Err(e) => {
            let text = e.to_string();
            let first = text
                .lines()
                .next()
                .unwrap_or("")
                .trim_start_matches("error: ");
            eprintln!("brig: {}", first.replace("--mcp-", "--"));
            return ExitCode::from(EXIT_BRIG_ERROR);
        }
    };
    let Some(runtime) = runtime() else {
        return ExitCode::from(EXIT_BRIG_ERROR);
    };
    finish(runtime.block_on(brig_server::mcp::serve_stdio_in_process(serve)))
}

/// The tools as calls to the daemon's REST API.
fn through_daemon(args: McpArgs) -> ExitCode {
    if args.data_dir.is_some() || args.store.is_some() {
        eprintln!(
            "brig: --data-dir and --store are for running without a daemon; the daemon has its own"
        );
        return ExitCode::from(EXIT_BRIG_ERROR);
    }
    let network = match args
        .network
        .as_deref()
        .map(serde_json::from_str)
        .transpose()
    {
        Ok(network) => network,
        Err(e) => {
            eprintln!("brig: --network: invalid JSON: {e}");
            return ExitCode::from(EXIT_BRIG_ERROR);
        }
    };
    let client = match crate::client_cmd::connect(&args.conn) {
        Ok(client) => client.on_behalf_of("mcp"),
        Err(e) => return finish(Err(e)),
    };
    let Some(runtime) = runtime() else {
        return ExitCode::from(EXIT_BRIG_ERROR);
    };
    let workspace = crate::mcp_daemon::DaemonWorkspace::new(client, args.image, network);
    finish(runtime.block_on(brig_server::mcp::serve_stdio(workspace)))
}
