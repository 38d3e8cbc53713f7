//! `brig mcp`: MCP over stdio, for agents that start their tools as processes
//! (`claude mcp add brig -- brig mcp`). With no daemon configured it runs the
//! engine in this process, on a data dir of its own; the MCP server itself is
//! brig-server's (`brig_server::mcp`).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use crate::EXIT_BRIG_ERROR;

#[derive(Args)]
pub struct McpArgs {
    /// The image of the session's sandbox [default: the host's read-only system dirs].
    #[arg(long, value_name = "NAME")]
    image: Option<String>,
    /// The sandbox's network policy, as `brig serve --session-network`'s, e.g.
    /// '{"mode":"allow","allow":["pypi.org:443"]}' [default: none].
    #[arg(long, value_name = "JSON")]
    network: Option<String>,
    /// The engine's state [default: $XDG_DATA_HOME/brig, else ~/.local/share/brig].
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// The image store [default: brig serve's].
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

pub fn main(args: McpArgs) -> ExitCode {
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
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .max_blocking_threads(brig_server::BLOCKING_THREADS)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("brig: cannot start the runtime: {e}");
            return ExitCode::from(EXIT_BRIG_ERROR);
        }
    };
    match runtime.block_on(brig_server::mcp::serve_stdio_in_process(serve)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("brig: {e:#}");
            ExitCode::from(EXIT_BRIG_ERROR)
        }
    }
}
