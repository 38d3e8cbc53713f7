//! The `brig` CLI as a client of the daemon (`brig serve`, see docs/API.md):
//! `brig session ...`, `brig exec`, `brig cp` and `brig key ...`.
//!
//! Everything here is blocking (ureq): one request at a time, bodies streamed in both
//! directions so copying a large file or directory never holds it in memory.
//!
//! Exit statuses: `brig exec` exits with the command's status (124 timed out, 128+N
//! killed by signal N, 137 OOM-killed); every failure of brig itself or of the API
//! prints one line, `brig: <message>` (API errors: `brig: <message> (<code>)`), and
//! exits 125, as `brig run` does.

use std::collections::BTreeMap;
use std::fmt;
use std::fs::{self, File};
use std::io::{self, BufRead, BufReader, IsTerminal, Read, Write};
use std::path::{Component, Path, PathBuf};
use std::process::ExitCode;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use ureq::http::Response;
use ureq::Body;

use crate::image_cmd::human_bytes;
use crate::EXIT_BRIG_ERROR;

/// Where `brig serve` listens by default.
pub(crate) const DEFAULT_URL: &str = "http://127.0.0.1:7700";
/// The daemon's default data dir, where it writes the admin key on first start.
const DEFAULT_DATA_DIR: &str = "/var/lib/brig-server";
/// Exit status when the command was killed by SIGPIPE: what a shell reports when
/// `brig exec ... | head` closes the pipe early.
const EXIT_BROKEN_PIPE: u8 = 128 + 13;

// ---------------------------------------------------------------------------------
// Command line
// ---------------------------------------------------------------------------------

/// How to reach the daemon. Each setting is taken from the first of: this flag, the
/// environment, the config file, the default (see `Settings::resolve`).
#[derive(Args, Clone, Debug, Default)]
pub struct ConnArgs {
    /// The daemon's URL [env: BRIG_URL; config: url; default: http://127.0.0.1:7700].
    #[arg(long, global = true, value_name = "URL")]
    pub url: Option<String>,
    /// API key [env: BRIG_API_KEY (preferred: flags are visible in `ps`); config:
    /// api_key; else the daemon's admin.key when readable].
    #[arg(long, global = true, value_name = "KEY")]
    pub api_key: Option<String>,
}

#[derive(Args)]
pub struct SessionArgs {
    #[command(flatten)]
    conn: ConnArgs,
    #[command(subcommand)]
    command: SessionCommand,
}

#[derive(Subcommand)]
enum SessionCommand {
    /// Start a session (a sandbox that lives between requests); prints its id.
    Create(Box<CreateArgs>),
    /// List your sessions.
    Ls {
        /// Only sessions with this metadata entry. Repeatable (all must match).
        #[arg(long = "meta", value_name = "KEY=VALUE")]
        metadata: Vec<String>,
        #[arg(long)]
        json: bool,
    },
    /// Change a live session: a new TTL (counted from now), idle timeout or labels.
    Update(UpdateArgs),
    /// What a session uses now (memory, CPU time, processes, disk) against its limits.
    Stats {
        id: String,
        #[arg(long)]
        json: bool,
    },
    /// Delete sessions: their processes are killed and their files are gone.
    Rm {
        #[arg(required = true, value_name = "ID")]
        ids: Vec<String>,
    },
    /// Freeze a session's processes.
    Pause { id: String },
    /// Thaw a paused session.
    Resume { id: String },
    /// Store what a session wrote as a snapshot (new sessions can start from it);
    /// prints the snapshot id.
    Snapshot {
        id: String,
        #[arg(long, value_name = "NAME")]
        name: Option<String>,
    },
}

#[derive(Args)]
struct CreateArgs {
    /// An image in the daemon's store [default: the daemon's default image].
    #[arg(long, value_name = "NAME")]
    image: Option<String>,
    /// Start from this snapshot (a fork of the session it was taken from).
    #[arg(long, value_name = "ID")]
    snapshot: Option<String>,
    /// Environment variable for everything run in the session. Repeatable.
    #[arg(long, value_name = "KEY=VALUE")]
    env: Vec<String>,
    /// Memory for the whole session (e.g. 512M).
    #[arg(long, value_name = "SIZE")]
    memory: Option<String>,
    /// Maximum number of processes and threads.
    #[arg(long, value_name = "N")]
    pids: Option<u64>,
    /// CPU bandwidth in CPUs, fractional allowed.
    #[arg(long, value_name = "N")]
    cpus: Option<f64>,
    /// Size of the session's writable storage.
    #[arg(long, value_name = "SIZE")]
    disk: Option<String>,
    /// Delete the session this long after it was created (e.g. 30m, 2h).
    #[arg(long, value_name = "DURATION")]
    ttl: Option<String>,
    /// Delete the session after this long without requests [default: the daemon's,
    /// or none with --ttl].
    #[arg(long, value_name = "DURATION")]
    idle_timeout: Option<String>,
    /// A label of your own, returned with the session and matched by
    /// `brig session ls --meta`. Repeatable.
    #[arg(long = "meta", value_name = "KEY=VALUE")]
    metadata: Vec<String>,
    /// Print the session as JSON instead of its id.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct UpdateArgs {
    id: String,
    /// End the session this long from now (e.g. 2h): keeps a session in use alive,
    /// or ends it sooner.
    #[arg(long, value_name = "DURATION")]
    ttl: Option<String>,
    /// Delete the session after this long without requests; 0 for never.
    #[arg(long, value_name = "DURATION")]
    idle_timeout: Option<String>,
    /// The session's labels become these (all of them). Repeatable.
    #[arg(long = "meta", value_name = "KEY=VALUE")]
    metadata: Vec<String>,
    /// Remove all the session's labels.
    #[arg(long, conflicts_with = "metadata")]
    clear_meta: bool,
    /// Print the session as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct ExecArgs {
    #[command(flatten)]
    conn: ConnArgs,
    /// The session to run in.
    session: String,
    /// Working directory [default: /workspace].
    #[arg(long, value_name = "DIR")]
    cwd: Option<String>,
    /// Environment variable (over the session's). Repeatable.
    #[arg(long, value_name = "KEY=VALUE")]
    env: Vec<String>,
    /// Wall-clock limit (e.g. 30s, 500ms) [default: the daemon's].
    #[arg(long, value_name = "DURATION")]
    timeout: Option<String>,
    /// Capture the output and print one JSON object when the command ends.
    #[arg(long)]
    json: bool,
    /// The command and its arguments.
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    command: Vec<String>,
}

#[derive(Args)]
pub struct CodeArgs {
    #[command(flatten)]
    conn: ConnArgs,
    /// The session to run in.
    session: String,
    /// A Python file to run [default: stdin].
    file: Option<std::path::PathBuf>,
    /// The context to run in [default: the session's `default`].
    #[arg(long, value_name = "ID")]
    context: Option<String>,
    /// Interrupt the code after this long (e.g. 30s) [default: the daemon's].
    #[arg(long, value_name = "DURATION")]
    timeout: Option<String>,
    /// Print the whole outcome as one JSON object when the code ends.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct CpArgs {
    #[command(flatten)]
    conn: ConnArgs,
    /// Copy a session directory (the default when the source is a directory anyway).
    #[arg(short = 'r', long)]
    recursive: bool,
    /// A local path, `-` (stdin/stdout) or SESSION:/absolute/path.
    src: String,
    /// A local path, `-` (stdin/stdout) or SESSION:/absolute/path.
    dst: String,
}

#[derive(Args)]
pub struct KeyArgs {
    #[command(flatten)]
    conn: ConnArgs,
    #[command(subcommand)]
    command: KeyCommand,
}

#[derive(Subcommand)]
enum KeyCommand {
    /// Create an API key for TENANT (created if new); the key is printed only once.
    Create {
        tenant: String,
        #[arg(long, value_name = "NAME")]
        name: Option<String>,
    },
    /// List API keys (admin: all; otherwise your tenant's).
    Ls {
        #[arg(long)]
        json: bool,
    },
    /// Revoke an API key.
    Revoke { key_id: String },
}

#[derive(Args)]
pub struct TenantArgs {
    #[command(flatten)]
    conn: ConnArgs,
    #[command(subcommand)]
    command: TenantCommand,
}

#[derive(Subcommand)]
enum TenantCommand {
    /// List tenants with their quotas and usage (admin).
    Ls {
        #[arg(long)]
        json: bool,
    },
    /// Show a tenant's quotas and usage (yours, or any for an admin).
    Show {
        tenant: String,
        #[arg(long)]
        json: bool,
    },
    /// Set a tenant's quotas (admin); options left out stay as they are, and
    /// "default" goes back to the daemon's default.
    Quota {
        tenant: String,
        /// Live sessions at once.
        #[arg(long, value_name = "N|default")]
        max_sessions: Option<String>,
        /// Execs running at once.
        #[arg(long, value_name = "N|default")]
        max_concurrent_execs: Option<String>,
        /// Disk: the sessions' disk limits plus stored files, volumes and snapshots
        /// (e.g. 50G).
        #[arg(long, value_name = "SIZE|default")]
        max_disk: Option<String>,
        #[arg(long)]
        json: bool,
    },
}

// ---------------------------------------------------------------------------------
// Entry points
// ---------------------------------------------------------------------------------

pub fn session(args: SessionArgs) -> ExitCode {
    let json = matches!(&args.command, SessionCommand::Ls { json: true, .. })
        || matches!(&args.command, SessionCommand::Create(c) if c.json);
    finish(
        json,
        connect(&args.conn).and_then(|c| session_cmd(&c, args.command)),
    )
}

pub fn exec(args: ExecArgs) -> ExitCode {
    let json = args.json;
    finish(json, connect(&args.conn).and_then(|c| exec_cmd(&c, args)))
}

pub fn code(args: CodeArgs) -> ExitCode {
    let json = args.json;
    finish(json, connect(&args.conn).and_then(|c| code_cmd(&c, args)))
}

pub fn cp(args: CpArgs) -> ExitCode {
    finish(false, connect(&args.conn).and_then(|c| cp_cmd(&c, args)))
}

pub fn key(args: KeyArgs) -> ExitCode {
    let json = matches!(&args.command, KeyCommand::Ls { json: true });
    finish(
        json,
        connect(&args.conn).and_then(|c| key_cmd(&c, args.command)),
    )
}

pub fn tenant(args: TenantArgs) -> ExitCode {
    let json = match &args.command {
        TenantCommand::Ls { json } => *json,
        TenantCommand::Show { json, .. } | TenantCommand::Quota { json, .. } => *json,
    };
    finish(
        json,
        connect(&args.conn).and_then(|c| tenant_cmd(&c, args.command)),
    )
}

/// Turns a command's result into its exit status, printing failures as one line (and,
/// in `--json` mode, as the `{"error": ...}` object on stdout, as `brig run` does).
fn finish(json: bool, result: Result<u8>) -> ExitCode {
    match result {
        Ok(status) => ExitCode::from(status),
        Err(e) => {
            let (code, message) = match e.downcast_ref::<ApiError>() {
                Some(api) => (api.code.clone(), api.message.clone()),
                None => ("client_error".to_string(), format!("{e:#}")),
            };
            if json {
                outln!("{}", json!({"error": {"code": code, "message": message}}));
            }
            eprintln!("brig: {}", one_line(&format!("{e:#}")));
            ExitCode::from(EXIT_BRIG_ERROR)
        }
    }
}

/// `text` as one line a terminal only prints: a message from the daemon (or a
/// server posing as one) could otherwise carry escape sequences that retitle the
/// window, move the cursor or rewrite what was printed before.
fn one_line(text: &str) -> String {
    let joined = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut shown = String::with_capacity(joined.len());
    for c in joined.chars() {
        if c.is_control() {
            shown.extend(c.escape_unicode());
        } else {
            shown.push(c);
        }
    }
    shown
}

// ---------------------------------------------------------------------------------
// Connection settings
// ---------------------------------------------------------------------------------

/// The daemon's address and the API key to present.
#[derive(Debug, PartialEq)]
pub(crate) struct Settings {
    pub url: String,
    pub api_key: Option<String>,
}

/// `client.toml`: `url = "..."`, `api_key = "..."`.
#[derive(Deserialize, Default, Debug)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    url: Option<String>,
    api_key: Option<String>,
}

impl Settings {
    /// Each setting comes from the first source that has it: the flag, the environment
    /// (`BRIG_URL`, `BRIG_API_KEY`), the config file (`$BRIG_CONFIG`, else
    /// `$XDG_CONFIG_HOME/brig/client.toml` or `~/.config/brig/client.toml`), then the
    /// default URL and, for the key, the daemon's `admin.key` if this user can read it
    /// (root on the daemon's host). `env` is the environment, passed in for tests.
    pub(crate) fn resolve(flags: &ConnArgs, env: &dyn Fn(&str) -> Option<String>) -> Result<Self> {
        // Empty variables count as unset, as `BRIG_API_KEY= brig ...` intends.
        let env = |name: &str| env(name).filter(|v| !v.is_empty());
        let mut url = flags.url.clone().or_else(|| env("BRIG_URL"));
        let mut api_key = flags.api_key.clone().or_else(|| env("BRIG_API_KEY"));
        // The config file is read only when needed: a broken file does not get in the
        // way of flags and variables that already say everything.
        if url.is_none() || api_key.is_none() {
            let config = load_config(&env)?;
            url = url.or(config.url);
            api_key = api_key.or(config.api_key);
        }
        let url = url.unwrap_or_else(|| DEFAULT_URL.to_string());
        let url = url.trim_end_matches('/').to_string();
        if !(url.starts_with("http://") || url.starts_with("https://")) || url.contains(['?', '#'])
        {
            bail!("bad daemon URL '{url}': expected http(s)://HOST:PORT");
        }
        if api_key.is_none() {
            let dir = env("BRIG_DATA_DIR").unwrap_or_else(|| DEFAULT_DATA_DIR.to_string());
            let dir = Path::new(&dir);
            // The admin key goes only to the daemon that wrote it, at the address it
            // serves on: any other URL (mistyped, copied, or a port someone bound
            // while the daemon was down) would be handed the daemon. Unreadable (not
            // root, no daemon here) simply means no key: the daemon then answers 401.
            let serving = brig_server::state::running_daemon_address(dir);
            if serving.is_some_and(|addr| url_reaches(&url, addr)) {
                api_key = fs::read_to_string(dir.join("admin.key"))
                    .ok()
                    .map(|k| k.trim().to_string())
                    .filter(|k| !k.is_empty());
            }
        }
        Ok(Settings { url, api_key })
    }
}

/// Whether `url` names an address of this host's loopback (or `localhost`).
fn is_loopback_url(url: &str) -> bool {
    url_host(url).is_some_and(|(host, _)| {
        host.eq_ignore_ascii_case("localhost")
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
    })
}

/// Whether `url` names the daemon listening on `addr`: the same port, and the same
/// address or, for a daemon listening on every address, a loopback address.
fn url_reaches(url: &str, addr: std::net::SocketAddr) -> bool {
    let Some((host, port)) = url_host(url) else {
        return false;
    };
    if port != addr.port() {
        return false;
    }
    // Only an address, not a name: `localhost` may resolve to ::1 while the daemon
    // listens on 127.0.0.1 only, and then another user's listener there gets the key.
    let Ok(ip) = host.parse::<std::net::IpAddr>() else {
        return false;
    };
    // A daemon on every address of one family holds the port on that family's
    // loopback only: `0.0.0.0:P` leaves `[::1]:P` for any user to bind.
    let same_family_loopback = match (addr.ip(), ip) {
        (std::net::IpAddr::V4(_), std::net::IpAddr::V4(ip)) => ip.is_loopback(),
        (std::net::IpAddr::V6(_), std::net::IpAddr::V6(ip)) => ip.is_loopback(),
        _ => false,
    };
    ip == addr.ip() || (addr.ip().is_unspecified() && same_family_loopback)
}

/// The host of `url` (an IPv6 address without its brackets) and its port (the
/// scheme's default if none is given).
fn url_host(url: &str) -> Option<(String, u16)> {
    let uri = url.parse::<ureq::http::Uri>().ok()?;
    let default_port = if uri.scheme_str() == Some("https") {
        443
    } else {
        80
    };
    let host = uri.host().unwrap_or_default();
    let host = host.trim_start_matches('[').trim_end_matches(']');
    Some((host.to_string(), uri.port_u16().unwrap_or(default_port)))
}

fn load_config(env: &dyn Fn(&str) -> Option<String>) -> Result<ConfigFile> {
    let (path, required) = match env("BRIG_CONFIG") {
        // Named explicitly: it must exist.
        Some(path) => (PathBuf::from(path), true),
        None => match env("XDG_CONFIG_HOME").or_else(|| env("HOME").map(|h| h + "/.config")) {
            Some(dir) => (Path::new(&dir).join("brig/client.toml"), false),
            None => return Ok(ConfigFile::default()),
        },
    };
    let text = match fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if !required && e.kind() == io::ErrorKind::NotFound => {
            return Ok(ConfigFile::default())
        }
        Err(e) => bail!("{}: {e}", path.display()),
    };
    toml::from_str(&text).map_err(|e| anyhow!("{}: {}", path.display(), one_line(&e.to_string())))
}

// ---------------------------------------------------------------------------------
// HTTP
// ---------------------------------------------------------------------------------

/// An error answered by the daemon: `{"error": {"code", "message"}}`.
#[derive(Debug)]
pub(crate) struct ApiError {
    pub status: u16,
    pub code: String,
    pub message: String,
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.message, self.code)
    }
}

impl std::error::Error for ApiError {}

/// Whether `e` is the daemon saying `code`.
fn is_api(e: &anyhow::Error, code: &str) -> bool {
    e.downcast_ref::<ApiError>().is_some_and(|a| a.code == code)
}

pub(crate) struct Client {
    agent: ureq::Agent,
    url: String,
    api_key: Option<String>,
    /// Says the requests are made for another front end (`X-Brig-Frontend`), so
    /// the daemon audits them as that one's (`brig mcp`: `mcp`).
    frontend: Option<&'static str>,
}

pub(crate) fn connect(conn: &ConnArgs) -> Result<Client> {
    let settings = Settings::resolve(conn, &|name| std::env::var(name).ok())?;
    let config = ureq::Agent::config_builder()
        // No proxy from the environment for a daemon on this host: a proxy has no
        // business between the two, and would be handed the key (the admin key
        // too, which goes only to a local daemon).
        .proxy(if is_loopback_url(&settings.url) {
            None
        } else {
            ureq::Proxy::try_from_env()
        })
        // Error statuses carry the API's JSON error, which we want to read.
        .http_status_as_error(false)
        // Only connecting is bounded: an exec or a download may rightly take hours.
        .timeout_connect(Some(Duration::from_secs(10)))
        .user_agent(format!("brig/{}", env!("CARGO_PKG_VERSION")))
        .build();
    Ok(Client {
        agent: config.into(),
        url: settings.url,
        api_key: settings.api_key,
        frontend: None,
    })
}

type Request<B> = ureq::RequestBuilder<B>;

impl Client {
    fn endpoint(&self, path: &str) -> String {
        format!("{}{path}", self.url)
    }

    /// This client's requests are made for front end `frontend` (see the field).
    pub(crate) fn on_behalf_of(mut self, frontend: &'static str) -> Client {
        self.frontend = Some(frontend);
        self
    }

    fn auth<B>(&self, request: Request<B>) -> Request<B> {
        let request = match self.frontend {
            Some(frontend) => request.header("X-Brig-Frontend", frontend),
            None => request,
        };
        match &self.api_key {
            Some(key) => request.header("Authorization", format!("Bearer {key}")),
            None => request,
        }
    }

    pub(crate) fn get(&self, path: &str) -> Request<ureq::typestate::WithoutBody> {
        self.auth(self.agent.get(self.endpoint(path)))
    }

    fn delete(&self, path: &str) -> Request<ureq::typestate::WithoutBody> {
        self.auth(self.agent.delete(self.endpoint(path)))
    }

    fn post(&self, path: &str) -> Request<ureq::typestate::WithBody> {
        self.auth(self.agent.post(self.endpoint(path)))
    }

    pub(crate) fn put(&self, path: &str) -> Request<ureq::typestate::WithBody> {
        self.auth(self.agent.put(self.endpoint(path)))
    }

    fn patch(&self, path: &str) -> Request<ureq::typestate::WithBody> {
        self.auth(self.agent.patch(self.endpoint(path)))
    }

    /// Turns transport failures and error statuses into one-line errors.
    pub(crate) fn check(
        &self,
        result: Result<Response<Body>, ureq::Error>,
    ) -> Result<Response<Body>> {
        let response = result.map_err(|e| self.transport_error(e))?;
        let status = response.status().as_u16();
        if status < 400 {
            return Ok(response);
        }
        // Error bodies are small; the limit keeps a confused server from flooding us.
        let text = response
            .into_body()
            .with_config()
            .limit(64 << 10)
            .lossy_utf8(true)
            .read_to_string()
            .unwrap_or_default();
        let parsed: Option<(String, String)> =
            serde_json::from_str::<Value>(&text).ok().and_then(|v| {
                let e = v.get("error")?;
                Some((e["code"].as_str()?.into(), e["message"].as_str()?.into()))
            });
        Err(match parsed {
            // The daemon's message speaks of headers; a CLI user sets a variable.
            Some((code, message)) if status == 401 && self.api_key.is_none() => ApiError {
                status,
                code,
                message: format!(
                    "{message}: this CLI found no key (give one with --api-key, BRIG_API_KEY \
                     or api_key in ~/.config/brig/client.toml; as root on the daemon's host, \
                     the admin key in BRIG_DATA_DIR (default {DEFAULT_DATA_DIR}) is sent to \
                     that daemon's own address only)"
                ),
            },
            Some((code, message)) => ApiError {
                status,
                code,
                message,
            },
            // Not brig's API (a proxy, another server on the port): say what we got.
            None => ApiError {
                status,
                code: format!("http_{status}"),
                message: match one_line(&text) {
                    t if t.is_empty() || t.len() > 200 => {
                        format!("HTTP {status} from {}", self.url)
                    }
                    t => format!("HTTP {status} from {}: {t}", self.url),
                },
            },
        }
        .into())
    }

    fn transport_error(&self, e: ureq::Error) -> anyhow::Error {
        let unreachable =
            |reason: &str| anyhow!("cannot reach the brig daemon at {}: {reason}", self.url);
        match &e {
            ureq::Error::Io(io) if io.kind() == io::ErrorKind::ConnectionRefused => {
                unreachable("connection refused (is `brig serve` running?)")
            }
            ureq::Error::HostNotFound => unreachable("host not found"),
            ureq::Error::ConnectionFailed => unreachable("connection failed"),
            ureq::Error::Timeout(ureq::Timeout::Connect | ureq::Timeout::Resolve) => {
                unreachable("timed out")
            }
            // Mid-request: the connection dropped, or a local read failed while
            // sending a body.
            other => anyhow!(
                "request to the brig daemon at {} failed: {}",
                self.url,
                one_line(&other.to_string())
            ),
        }
    }

    fn json_request(
        &self,
        request: Request<ureq::typestate::WithBody>,
        body: &Value,
    ) -> Result<Response<Body>> {
        self.check(
            request
                .header("Content-Type", "application/json")
                .send(serde_json::to_vec(body)?),
        )
    }

    pub(crate) fn post_json(&self, path: &str, body: &Value) -> Result<Value> {
        read_json(self.json_request(self.post(path), body)?)
    }

    pub(crate) fn get_json(&self, path: &str) -> Result<Value> {
        read_json(self.check(self.get(path).call())?)
    }

    fn put_json(&self, path: &str, body: &Value) -> Result<Value> {
        read_json(self.json_request(self.put(path), body)?)
    }

    fn patch_json(&self, path: &str, body: &Value) -> Result<Value> {
        read_json(self.json_request(self.patch(path), body)?)
    }

    pub(crate) fn delete_ok(&self, path: &str) -> Result<()> {
        self.check(self.delete(path).call())?;
        Ok(())
    }
}

fn read_json(response: Response<Body>) -> Result<Value> {
    let text = response
        .into_body()
        .with_config()
        .limit(64 << 20)
        .read_to_string()
        .context("reading the daemon's answer")?;
    serde_json::from_str(&text).map_err(|e| anyhow!("the daemon's answer is not JSON: {e}"))
}

/// Percent-encodes one path segment (ids come from users and must not add segments).
pub(crate) fn seg(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

pub(crate) fn session_path(id: &str, rest: &str) -> String {
    format!("/v1/sessions/{}{rest}", seg(id))
}

fn str_field<'a>(value: &'a Value, key: &str) -> &'a str {
    value.get(key).and_then(Value::as_str).unwrap_or("-")
}

/// Parses repeated `--FLAG KEY=VALUE` flags.
fn pairs(flag: &str, entries: &[String]) -> Result<BTreeMap<String, String>> {
    entries
        .iter()
        .map(|entry| match entry.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
            _ => bail!("bad --{flag} '{entry}': expected KEY=VALUE"),
        })
        .collect()
}

/// Left-aligned columns, two spaces apart.
fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let header: Vec<String> = headers.iter().map(|h| h.to_string()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:w$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

// ---------------------------------------------------------------------------------
// brig session / brig key
// ---------------------------------------------------------------------------------

fn session_cmd(client: &Client, command: SessionCommand) -> Result<u8> {
    match command {
        SessionCommand::Create(args) => {
            let body = create_body(&args)?;
            let session = client.post_json("/v1/sessions", &body)?;
            if args.json {
                outln!("{session}");
            } else {
                outln!("{}", str_field(&session, "session_id"));
            }
        }
        SessionCommand::Ls { metadata, json } => {
            let mut path = "/v1/sessions".to_string();
            for (i, entry) in metadata.iter().enumerate() {
                if !entry.contains('=') {
                    bail!("bad --meta '{entry}': expected KEY=VALUE");
                }
                path.push(if i == 0 { '?' } else { '&' });
                path.push_str("metadata=");
                path.push_str(&seg(entry));
            }
            let list = client.get_json(&path)?;
            if json {
                outln!("{list}");
                return Ok(0);
            }
            let rows: Vec<Vec<String>> = list["sessions"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default()
                .iter()
                .map(|s| {
                    ["session_id", "state", "image", "created_at", "expires_at"]
                        .iter()
                        .map(|k| str_field(s, k).to_string())
                        .collect()
                })
                .collect();
            print!(
                "{}",
                table(&["ID", "STATE", "IMAGE", "CREATED", "EXPIRES"], &rows)
            );
        }
        SessionCommand::Update(args) => {
            let body = update_body(&args)?;
            let session = client.patch_json(&session_path(&args.id, ""), &body)?;
            if args.json {
                outln!("{session}");
            }
        }
        SessionCommand::Stats { id, json } => {
            let stats = client.get_json(&session_path(&id, "/stats"))?;
            if json {
                outln!("{stats}");
            } else {
                print!("{}", stats_table(&stats));
            }
        }
        SessionCommand::Rm { ids } => {
            // Remove all that can be; report each failure, fail if any did.
            let mut failed = false;
            for id in &ids {
                if let Err(e) = client.delete_ok(&session_path(id, "")) {
                    eprintln!("brig: {id}: {}", one_line(&format!("{e:#}")));
                    failed = true;
                }
            }
            return Ok(if failed { EXIT_BRIG_ERROR } else { 0 });
        }
        SessionCommand::Pause { id } => {
            client.post_json(&session_path(&id, "/pause"), &json!({}))?;
        }
        SessionCommand::Resume { id } => {
            client.post_json(&session_path(&id, "/resume"), &json!({}))?;
        }
        SessionCommand::Snapshot { id, name } => {
            let mut body = Map::new();
            if let Some(name) = name {
                body.insert("name".into(), name.into());
            }
            let snapshot =
                client.post_json(&session_path(&id, "/snapshots"), &Value::Object(body))?;
            outln!("{}", str_field(&snapshot, "snapshot_id"));
        }
    }
    Ok(0)
}

/// `brig session stats` for people: one line per resource, use against limit.
fn stats_table(stats: &Value) -> String {
    let bytes = |field: &str| match stats[field].as_u64() {
        Some(n) => human_bytes(n),
        None => "-".into(),
    };
    let count = |field: &str| match stats[field].as_f64() {
        Some(n) => format!("{n}"),
        None => "-".into(),
    };
    let cpu = match stats["cpu_seconds"].as_f64() {
        Some(s) => format!("{s:.2} s"),
        None => "-".into(),
    };
    let mut rows = vec![
        vec![
            "memory".into(),
            bytes("memory_bytes"),
            bytes("memory_limit_bytes"),
            format!("peak {}", bytes("memory_peak_bytes")),
        ],
        vec![
            "cpu".into(),
            cpu,
            format!("{} CPUs", count("cpus_limit")),
            String::new(),
        ],
        vec![
            "tasks".into(),
            count("tasks"),
            count("tasks_limit"),
            String::new(),
        ],
        vec![
            "disk".into(),
            bytes("disk_used_bytes"),
            bytes("disk_limit_bytes"),
            String::new(),
        ],
        vec![
            "oom kills".into(),
            count("oom_kills"),
            String::new(),
            String::new(),
        ],
    ];
    if stats["volume_used_bytes"].is_u64() {
        rows.insert(
            4,
            vec![
                "volume".into(),
                bytes("volume_used_bytes"),
                bytes("volume_size_bytes"),
                "shared".into(),
            ],
        );
    }
    table(&["", "USED", "LIMIT", ""], &rows)
}

/// Whole seconds for a duration flag, rounded up so `--ttl 500ms` is not "no TTL".
fn duration_secs(flag: &str, text: &str) -> Result<u64> {
    let ms = brig_policy::parse_duration_ms(text).map_err(|e| anyhow!("--{flag}: {e}"))?;
    Ok(ms.div_ceil(1000))
}

fn update_body(args: &UpdateArgs) -> Result<Value> {
    let mut body = Map::new();
    insert_lifetimes(&mut body, &args.ttl, &args.idle_timeout)?;
    if !args.metadata.is_empty() {
        body.insert("metadata".into(), json!(pairs("meta", &args.metadata)?));
    }
    if args.clear_meta {
        body.insert("metadata".into(), json!({}));
    }
    if body.is_empty() {
        bail!("nothing to change: give --ttl, --idle-timeout, --meta or --clear-meta");
    }
    Ok(body.into())
}

fn create_body(args: &CreateArgs) -> Result<Value> {
    let mut body = Map::new();
    if let Some(image) = &args.image {
        body.insert("image".into(), image.clone().into());
    }
    if let Some(snapshot) = &args.snapshot {
        body.insert("snapshot".into(), snapshot.clone().into());
    }
    if !args.env.is_empty() {
        body.insert("env".into(), json!(pairs("env", &args.env)?));
    }
    if !args.metadata.is_empty() {
        body.insert("metadata".into(), json!(pairs("meta", &args.metadata)?));
    }
    let mut limits = Map::new();
    // Sizes are checked here for an early, local error, and sent as bytes.
    for (name, value) in [("memory", &args.memory), ("disk", &args.disk)] {
        if let Some(text) = value {
            let bytes = brig_policy::parse_size(text).map_err(|e| anyhow!("--{name}: {e}"))?;
            limits.insert(name.into(), bytes.into());
        }
    }
    if let Some(pids) = args.pids {
        limits.insert("pids".into(), pids.into());
    }
    if let Some(cpus) = args.cpus {
        limits.insert("cpus".into(), cpus.into());
    }
    if !limits.is_empty() {
        body.insert("limits".into(), limits.into());
    }
    insert_lifetimes(&mut body, &args.ttl, &args.idle_timeout)?;
    Ok(body.into())
}

/// `--ttl` and `--idle-timeout` as the API's `ttl_seconds` and `idle_timeout_seconds`.
fn insert_lifetimes(
    body: &mut Map<String, Value>,
    ttl: &Option<String>,
    idle_timeout: &Option<String>,
) -> Result<()> {
    if let Some(ttl) = ttl {
        body.insert("ttl_seconds".into(), duration_secs("ttl", ttl)?.into());
    }
    if let Some(idle) = idle_timeout {
        body.insert(
            "idle_timeout_seconds".into(),
            duration_secs("idle-timeout", idle)?.into(),
        );
    }
    Ok(())
}

fn key_cmd(client: &Client, command: KeyCommand) -> Result<u8> {
    match command {
        KeyCommand::Create { tenant, name } => {
            let mut body = json!({ "tenant": tenant });
            if let Some(name) = name {
                body["name"] = name.into();
            }
            let key = client.post_json("/v1/keys", &body)?;
            outln!("{}", str_field(&key, "key"));
            eprintln!(
                "brig: key {} for tenant {}: store it now, it is not shown again",
                str_field(&key, "key_id"),
                str_field(&key, "tenant")
            );
        }
        KeyCommand::Ls { json } => {
            let list = client.get_json("/v1/keys")?;
            if json {
                outln!("{list}");
                return Ok(0);
            }
            let rows: Vec<Vec<String>> = list["keys"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default()
                .iter()
                .map(|k| {
                    ["key_id", "tenant", "name", "created_at", "revoked_at"]
                        .iter()
                        .map(|f| str_field(k, f).to_string())
                        .collect()
                })
                .collect();
            print!(
                "{}",
                table(&["KEY ID", "TENANT", "NAME", "CREATED", "REVOKED"], &rows)
            );
        }
        KeyCommand::Revoke { key_id } => {
            client.delete_ok(&format!("/v1/keys/{}", seg(&key_id)))?;
        }
    }
    Ok(0)
}

fn tenant_cmd(client: &Client, command: TenantCommand) -> Result<u8> {
    let (tenants, json) = match command {
        TenantCommand::Ls { json } => {
            let list = client.get_json("/v1/tenants")?;
            let tenants = list["tenants"].as_array().cloned().unwrap_or_default();
            (tenants, json.then_some(list))
        }
        TenantCommand::Show { tenant, json } => {
            let info = client.get_json(&format!("/v1/tenants/{}", seg(&tenant)))?;
            (vec![info.clone()], json.then_some(info))
        }
        TenantCommand::Quota {
            tenant,
            max_sessions,
            max_concurrent_execs,
            max_disk,
            json,
        } => {
            // `null` in the API: the daemon's default.
            let quota = |flag: &str, text: &str, parse: fn(&str) -> Result<u64>| {
                if text == "default" {
                    Ok(Value::Null)
                } else {
                    parse(text)
                        .map(Value::from)
                        .map_err(|e| anyhow!("--{flag}: {e}"))
                }
            };
            let count = |text: &str| {
                text.parse::<u64>()
                    .map_err(|_| anyhow!("'{text}' is not a count or \"default\""))
            };
            let size = |text: &str| brig_policy::parse_size(text).map_err(|e| anyhow!(e));
            let mut body = serde_json::Map::new();
            for (flag, field, value, parse) in [
                (
                    "max-sessions",
                    "max_sessions",
                    &max_sessions,
                    count as fn(&str) -> _,
                ),
                (
                    "max-concurrent-execs",
                    "max_concurrent_execs",
                    &max_concurrent_execs,
                    count,
                ),
                ("max-disk", "max_disk_bytes", &max_disk, size),
            ] {
                if let Some(text) = value {
                    body.insert(field.into(), quota(flag, text, parse)?);
                }
            }
            if body.is_empty() {
                bail!("nothing to set: give --max-sessions, --max-concurrent-execs or --max-disk");
            }
            let path = format!("/v1/tenants/{}/quotas", seg(&tenant));
            let info = client.put_json(&path, &body.into())?;
            (vec![info.clone()], json.then_some(info))
        }
    };
    if let Some(json) = json {
        outln!("{json}");
        return Ok(0);
    }
    let count = |t: &Value, used: &str, max: &str| {
        let used = t["usage"][used].as_u64().unwrap_or(0);
        match t["quotas"][max].as_u64() {
            Some(max) => format!("{used}/{max}"),
            None => format!("{used}/-"),
        }
    };
    let bytes = |v: &Value| v.as_u64().map_or("-".to_string(), human_bytes);
    let rows: Vec<Vec<String>> = tenants
        .iter()
        .map(|t| {
            vec![
                str_field(t, "tenant").to_string(),
                count(t, "sessions", "max_sessions"),
                count(t, "concurrent_execs", "max_concurrent_execs"),
                format!(
                    "{} of {}",
                    bytes(&t["usage"]["disk_bytes"]),
                    bytes(&t["quotas"]["max_disk_bytes"])
                ),
            ]
        })
        .collect();
    print!("{}", table(&["TENANT", "SESSIONS", "EXECS", "DISK"], &rows));
    Ok(0)
}

// ---------------------------------------------------------------------------------
// brig code
// ---------------------------------------------------------------------------------

/// Runs Python in a session's interpreter: output as it comes, each result's
/// text, an error's traceback on stderr. Exits 0, 1 when the code raised, 124 when
/// it was interrupted at its timeout.
fn code_cmd(client: &Client, args: CodeArgs) -> Result<u8> {
    let code = match &args.file {
        Some(file) => {
            std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?
        }
        None => {
            let mut code = String::new();
            io::stdin()
                .lock()
                .read_to_string(&mut code)
                .context("reading the code from stdin")?;
            code
        }
    };
    let mut body = json!({ "code": code });
    if let Some(context) = &args.context {
        body["context_id"] = context.clone().into();
    }
    if let Some(timeout) = &args.timeout {
        let ms = brig_policy::parse_duration_ms(timeout).map_err(|e| anyhow!("--timeout: {e}"))?;
        body["timeout_ms"] = ms.into();
    }
    let path = session_path(&args.session, "/code");
    if args.json {
        let summary = client.post_json(&path, &body)?;
        outln!("{summary}");
        return Ok(code_status(summary["error"].is_object(), &summary));
    }
    let response = client.json_request(
        client.post(&path).header("Accept", "text/event-stream"),
        &body,
    )?;
    let mut events = SseReader::new(BufReader::new(response.into_body().into_reader()));
    let (mut stdout, mut stderr) = (io::stdout().lock(), io::stderr().lock());
    let mut failed = false;
    while let Some(event) = events.next_event().context("reading the output stream")? {
        let data: Value = serde_json::from_str(&event.data)
            .map_err(|e| anyhow!("bad '{}' event from the daemon: {e}", event.event))?;
        let (to_stdout, text) = match event.event.as_str() {
            "stdout" => (true, data["data"].as_str().unwrap_or_default().to_string()),
            "stderr" => (false, data["data"].as_str().unwrap_or_default().to_string()),
            "result" => {
                let text = data["data"]["text/plain"].as_str().unwrap_or_default();
                (true, format!("{text}\n"))
            }
            "error" => {
                failed = true;
                let traceback = data["traceback"].as_str().unwrap_or_default();
                let text = match traceback.is_empty() {
                    true => format!(
                        "{}: {}\n",
                        str_field(&data, "name"),
                        str_field(&data, "value")
                    ),
                    false => traceback.to_string(),
                };
                (false, text)
            }
            "end" => return Ok(code_status(failed, &data)),
            // Unknown events are for newer clients.
            _ => continue,
        };
        let written = if to_stdout {
            stdout
                .write_all(text.as_bytes())
                .and_then(|_| stdout.flush())
        } else {
            stderr
                .write_all(text.as_bytes())
                .and_then(|_| stderr.flush())
        };
        match written {
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => return Ok(EXIT_BROKEN_PIPE),
            other => other.context("writing output")?,
        }
    }
    bail!("the daemon closed the output stream before the code ended")
}

fn code_status(failed: bool, end: &Value) -> u8 {
    if end["timed_out"] == true {
        124
    } else {
        u8::from(failed)
    }
}

// ---------------------------------------------------------------------------------
// brig exec
// ---------------------------------------------------------------------------------

fn exec_cmd(client: &Client, args: ExecArgs) -> Result<u8> {
    let mut body = json!({ "argv": args.command });
    if let Some(cwd) = &args.cwd {
        body["cwd"] = cwd.clone().into();
    }
    if !args.env.is_empty() {
        body["env"] = json!(pairs("env", &args.env)?);
    }
    let timeout_ms = args
        .timeout
        .as_deref()
        .map(|t| brig_policy::parse_duration_ms(t).map_err(|e| anyhow!("--timeout: {e}")))
        .transpose()?;
    if let Some(ms) = timeout_ms {
        body["timeout_ms"] = ms.into();
    }
    // A terminal is never read: an interactive caller would have to press Ctrl-D.
    let stdin = io::stdin();
    if !stdin.is_terminal() {
        let mut input = Vec::new();
        stdin
            .lock()
            .read_to_end(&mut input)
            .context("reading stdin")?;
        if !input.is_empty() {
            let text = String::from_utf8(input).map_err(|_| {
                anyhow!("stdin is not UTF-8 text (the exec API takes stdin as a string)")
            })?;
            body["stdin"] = text.into();
        }
    }

    if args.json {
        let result = client.post_json(&session_path(&args.session, "/exec"), &body)?;
        outln!("{result}");
        let (status, message) = exit_status(&result, timeout_ms);
        if let Some(message) = message {
            eprintln!("brig: {}", one_line(&message));
        }
        return Ok(status);
    }

    let response = client.json_request(
        client
            .post(&session_path(&args.session, "/exec/stream"))
            .header("Accept", "text/event-stream"),
        &body,
    )?;
    let mut events = SseReader::new(BufReader::new(response.into_body().into_reader()));
    let (mut stdout, mut stderr) = (io::stdout().lock(), io::stderr().lock());
    while let Some(event) = events.next_event().context("reading the output stream")? {
        let data: Value = serde_json::from_str(&event.data)
            .map_err(|e| anyhow!("bad '{}' event from the daemon: {e}", event.event))?;
        match event.event.as_str() {
            "stdout" | "stderr" => {
                let chunk = data["data"].as_str().unwrap_or_default().as_bytes();
                let written = if event.event == "stdout" {
                    stdout.write_all(chunk).and_then(|_| stdout.flush())
                } else {
                    stderr.write_all(chunk).and_then(|_| stderr.flush())
                };
                match written {
                    // The reader went away (`| head`): stop as a killed writer would.
                    Err(e) if e.kind() == io::ErrorKind::BrokenPipe => return Ok(EXIT_BROKEN_PIPE),
                    other => other.context("writing output")?,
                }
            }
            "exit" => {
                let (status, message) = exit_status(&data, timeout_ms);
                if let Some(message) = message {
                    // (The stderr lock is reentrant: this does not wait on ours.)
                    eprintln!("brig: {}", one_line(&message));
                }
                return Ok(status);
            }
            "error" => {
                return Err(ApiError {
                    status: 0,
                    code: data["code"].as_str().unwrap_or("internal").to_string(),
                    message: data["message"]
                        .as_str()
                        .unwrap_or("exec failed")
                        .to_string(),
                }
                .into())
            }
            // Unknown events are for newer clients.
            _ => {}
        }
    }
    bail!("the daemon closed the output stream before the command ended")
}

/// The exit status for an exec result (`exit_code`, `signal`, `timed_out`,
/// `oom_killed`, `file_locks_exceeded`, `error`) and, for abnormal ends, a one-line explanation; the same
/// rules as `brig run`.
pub(crate) fn exit_status(result: &Value, timeout_ms: Option<u64>) -> (u8, Option<String>) {
    let exit_code = result["exit_code"].as_i64();
    let signal = result["signal"].as_i64();
    if result["timed_out"].as_bool() == Some(true) {
        let after = timeout_ms
            .map(|ms| format!(" after {ms}ms"))
            .unwrap_or_default();
        return (
            124,
            Some(format!("timed out{after}; the command was killed")),
        );
    }
    if result["oom_killed"].as_bool() == Some(true) {
        return (128 + 9, Some("killed: out of memory".into()));
    }
    if result["file_locks_exceeded"].as_bool() == Some(true) {
        return (
            128 + 9,
            Some("killed: the session held more file locks than its budget (one per 4 KiB of its memory limit)".into()),
        );
    }
    let error = result["error"].as_str().map(str::to_string);
    match (exit_code, signal) {
        (Some(code), _) => (code.rem_euclid(256) as u8, error),
        (None, Some(sig)) if (1..128).contains(&sig) => (128 + sig as u8, error),
        _ => (
            EXIT_BRIG_ERROR,
            Some(error.unwrap_or_else(|| "the command ended without a status".into())),
        ),
    }
}

/// One Server-Sent Event.
#[derive(Debug, PartialEq)]
pub(crate) struct SseEvent {
    pub event: String,
    pub data: String,
}

/// The most one event may hold. The daemon sends output in chunks of at most 64
/// KiB (a few hundred KiB as escaped JSON); without a bound, a server that never
/// ends a line would have the client hold all it sends.
const MAX_EVENT_BYTES: u64 = 16 << 20;

/// A minimal Server-Sent Events parser (the WHATWG rules brig's daemon needs):
/// `event:` and `data:` fields (one optional space after the colon), several `data`
/// lines joined by `\n`, `:` comments, other fields ignored, a blank line ends an
/// event, and an event with no data is not dispatched. An event over
/// [`MAX_EVENT_BYTES`] is an error.
pub(crate) struct SseReader<R> {
    reader: R,
    line: Vec<u8>,
}

impl<R: BufRead> SseReader<R> {
    pub fn new(reader: R) -> Self {
        SseReader {
            reader,
            line: Vec::new(),
        }
    }

    /// The next event; `None` at the end of the stream (an unterminated event at the
    /// end is dropped, as the spec says).
    pub fn next_event(&mut self) -> io::Result<Option<SseEvent>> {
        let mut event = String::new();
        let mut data: Option<String> = None;
        let mut room = MAX_EVENT_BYTES;
        loop {
            self.line.clear();
            let read = (&mut self.reader)
                .take(room + 1)
                .read_until(b'\n', &mut self.line)?;
            if read == 0 {
                return Ok(None);
            }
            room = room.checked_sub(read as u64).ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("an event of the stream is over {MAX_EVENT_BYTES} bytes"),
                )
            })?;
            let mut line = self.line.as_slice();
            line = line.strip_suffix(b"\n").unwrap_or(line);
            line = line.strip_suffix(b"\r").unwrap_or(line);
            if line.is_empty() {
                match data.take() {
                    Some(data) => {
                        let event = if event.is_empty() {
                            "message".into()
                        } else {
                            event
                        };
                        return Ok(Some(SseEvent { event, data }));
                    }
                    None => {
                        event.clear();
                        room = MAX_EVENT_BYTES;
                        continue;
                    }
                }
            }
            let line = String::from_utf8_lossy(line);
            let (field, value) = match line.split_once(':') {
                Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
                None => (line.as_ref(), ""),
            };
            match field {
                "" => {} // a comment (keep-alive)
                "event" => event = value.to_string(),
                "data" => match &mut data {
                    Some(data) => {
                        data.push('\n');
                        data.push_str(value);
                    }
                    None => data = Some(value.to_string()),
                },
                _ => {}
            }
        }
    }
}

// ---------------------------------------------------------------------------------
// brig cp
// ---------------------------------------------------------------------------------

/// One side of `brig cp`.
#[derive(Debug, PartialEq)]
pub(crate) enum Location {
    /// `-`: stdin as a source, stdout as a destination.
    Stdio,
    Local(PathBuf),
    Remote {
        session: String,
        path: String,
    },
}

impl Location {
    /// `SESSION:/abs/path` names a path in a session; anything else is local. A local
    /// path with a colon in its first component is written `./name:with:colons`.
    pub(crate) fn parse(text: &str) -> Result<Location> {
        if text == "-" {
            return Ok(Location::Stdio);
        }
        match text.split_once(':') {
            Some((session, path)) if !session.is_empty() && !session.contains('/') => {
                if !path.starts_with('/') {
                    bail!("'{text}': the path in a session must be absolute (SESSION:/path)");
                }
                Ok(Location::Remote {
                    session: session.to_string(),
                    path: path.to_string(),
                })
            }
            _ if text.is_empty() => bail!("empty path"),
            _ => Ok(Location::Local(PathBuf::from(text))),
        }
    }
}

/// The last component of a session path (`""` for `/`).
fn remote_name(path: &str) -> &str {
    path.trim_end_matches('/').rsplit('/').next().unwrap_or("")
}

fn remote_join(dir: &str, name: &str) -> String {
    format!("{}/{name}", dir.trim_end_matches('/'))
}

fn cp_cmd(client: &Client, args: CpArgs) -> Result<u8> {
    match (Location::parse(&args.src)?, Location::parse(&args.dst)?) {
        (Location::Remote { .. }, Location::Remote { .. }) => {
            bail!("copy between sessions is not supported: one side must be local")
        }
        (Location::Remote { session, path }, local) => {
            download(client, &session, &path, &local, args.recursive)?
        }
        (local, Location::Remote { session, path }) => upload(client, &local, &session, &path)?,
        _ => bail!("one side must be in a session: SESSION:/path"),
    }
    Ok(0)
}

impl Client {
    /// Whether `path` is a directory in the session. A missing path is not; any
    /// other refusal (unknown session, bad key) is an error.
    fn remote_is_dir(&self, session: &str, path: &str) -> Result<bool> {
        match self.check(
            self.get(&session_path(session, "/dir"))
                .query("path", path)
                .call(),
        ) {
            Ok(_) => Ok(true),
            Err(e)
                if e.downcast_ref::<ApiError>()
                    .is_some_and(|a| a.status == 404 || a.status == 409)
                    && !is_api(&e, "not_found") =>
            {
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }
}

/// Uploads start with `Expect: 100-continue` so that a refusal (unknown session, over
/// quota) comes back as the API's error before any of the body is sent, instead of a
/// connection reset in the middle of it.
fn upload(client: &Client, src: &Location, session: &str, dst: &str) -> Result<()> {
    if let Location::Stdio = src {
        let request = client
            .put(&session_path(session, "/files"))
            .query("path", dst)
            .header("Expect", "100-continue");
        client.check(request.send(ureq::SendBody::from_owned_reader(io::stdin())))?;
        return Ok(());
    }
    let Location::Local(src) = src else {
        unreachable!()
    };
    let meta = fs::metadata(src).map_err(|e| anyhow!("{}: {e}", src.display()))?;
    // Like cp: into an existing directory (or one named with a trailing slash), the
    // source keeps its name.
    let target = match src.file_name().and_then(|n| n.to_str()) {
        Some(name) if dst.ends_with('/') || client.remote_is_dir(session, dst)? => {
            remote_join(dst, name)
        }
        _ => dst.to_string(),
    };
    if meta.is_dir() {
        return upload_dir(client, src, session, &target);
    }
    let file = File::open(src).map_err(|e| anyhow!("{}: {e}", src.display()))?;
    let request = client
        .put(&session_path(session, "/files"))
        .query("path", &target)
        .header("Expect", "100-continue");
    // A File is sent with its length, read as it goes out.
    client.check(request.send(file))?;
    Ok(())
}

fn upload_dir(client: &Client, src: &Path, session: &str, target: &str) -> Result<()> {
    // The tar is written by a thread into a bounded channel and read by the upload,
    // so memory stays at a few chunks whatever the directory's size.
    let (tx, rx) = sync_channel(8);
    let root = src.to_path_buf();
    let writer = std::thread::spawn(move || {
        let mut out = ChunkWriter::new(tx.clone());
        let result = write_tar(&root, &mut out).and_then(|_| out.flush());
        let end = match &result {
            Ok(()) => Ok(None),
            Err(e) => Err(io::Error::new(e.kind(), e.to_string())),
        };
        let _ = tx.send(end);
        result
    });
    let request = client
        .put(&session_path(session, "/archive"))
        .query("path", target)
        .header("Content-Type", "application/x-tar")
        .header("Expect", "100-continue");
    let sent = client.check(request.send(ureq::SendBody::from_owned_reader(ChunkReader::new(rx))));
    let archived = writer
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("the archive writer panicked")));
    // The archive's own error (an unreadable file) says more than the upload's.
    match (archived, sent) {
        (Err(e), _) if e.kind() != io::ErrorKind::BrokenPipe => Err(anyhow!("{e}")),
        (_, sent) => sent.map(|_| ()),
    }
}

/// Writes `root`'s contents as a tar stream, paths relative to `root`, symlinks kept
/// as symlinks; sockets and other special files are skipped with a warning.
fn write_tar(root: &Path, out: &mut dyn Write) -> io::Result<()> {
    let mut builder = tar::Builder::new(out);
    builder.follow_symlinks(false);
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let path = root.join(&rel);
        let context = |e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", path.display()));
        let meta = fs::symlink_metadata(&path).map_err(context)?;
        let kind = meta.file_type();
        if kind.is_dir() {
            if !rel.as_os_str().is_empty() {
                builder.append_dir(&rel, &path).map_err(context)?;
            }
            let mut children: Vec<PathBuf> = fs::read_dir(&path)
                .map_err(context)?
                .map(|e| e.map(|e| rel.join(e.file_name())))
                .collect::<io::Result<_>>()
                .map_err(context)?;
            // Reversed so the stack yields them in name order.
            children.sort_unstable_by(|a, b| b.cmp(a));
            stack.extend(children);
        } else if kind.is_file() || kind.is_symlink() {
            builder
                .append_path_with_name(&path, &rel)
                .map_err(context)?;
        } else {
            eprintln!(
                "brig: skipped {}: not a file, directory or symlink",
                path.display()
            );
        }
    }
    builder.into_inner()?;
    Ok(())
}

/// The writing half of the tar pipe: sends 64 KiB chunks; `Ok(None)` marks the end.
struct ChunkWriter {
    tx: SyncSender<io::Result<Option<Vec<u8>>>>,
    buf: Vec<u8>,
}

const CHUNK: usize = 64 << 10;

impl ChunkWriter {
    fn new(tx: SyncSender<io::Result<Option<Vec<u8>>>>) -> Self {
        ChunkWriter {
            tx,
            buf: Vec::with_capacity(CHUNK),
        }
    }

    fn send(&mut self) -> io::Result<()> {
        let chunk = std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK));
        self.tx
            .send(Ok(Some(chunk)))
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the upload stopped"))
    }
}

impl Write for ChunkWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let n = data.len().min(CHUNK - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() == CHUNK {
            self.send()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        if !self.buf.is_empty() {
            self.send()?;
        }
        Ok(())
    }
}

/// The reading half: a writer that stops without the end mark is an error, so a
/// failed archive is never uploaded as a shorter one.
struct ChunkReader {
    rx: Receiver<io::Result<Option<Vec<u8>>>>,
    chunk: Vec<u8>,
    pos: usize,
    done: bool,
}

impl ChunkReader {
    fn new(rx: Receiver<io::Result<Option<Vec<u8>>>>) -> Self {
        ChunkReader {
            rx,
            chunk: Vec::new(),
            pos: 0,
            done: false,
        }
    }
}

impl Read for ChunkReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.pos == self.chunk.len() {
            if self.done {
                return Ok(0);
            }
            match self.rx.recv() {
                Ok(Ok(Some(chunk))) => (self.chunk, self.pos) = (chunk, 0),
                Ok(Ok(None)) => self.done = true,
                Ok(Err(e)) => return Err(e),
                Err(_) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the archive writer stopped early",
                    ))
                }
            }
        }
        let n = out.len().min(self.chunk.len() - self.pos);
        out[..n].copy_from_slice(&self.chunk[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

fn download(
    client: &Client,
    session: &str,
    path: &str,
    dst: &Location,
    recursive: bool,
) -> Result<()> {
    if !recursive {
        let fetched = client.check(
            client
                .get(&session_path(session, "/files"))
                .query("path", path)
                .call(),
        );
        match fetched {
            Ok(response) => return save_file(response, path, dst),
            // Not a regular file: if it is a directory, copy it as one.
            Err(e)
                if e.downcast_ref::<ApiError>()
                    .is_some_and(|a| a.status == 409 || a.status == 422)
                    && client.remote_is_dir(session, path)? => {}
            Err(e) => return Err(e),
        }
    }
    let response = client.check(
        client
            .get(&session_path(session, "/archive"))
            .query("path", path)
            .call(),
    )?;
    let reader = response.into_body().into_reader();
    match dst {
        Location::Stdio => {
            io::copy(&mut { reader }, &mut io::stdout().lock()).context("writing the archive")?;
            Ok(())
        }
        Location::Local(dst) => {
            let name = remote_name(path);
            let target = if dst.is_dir() && !name.is_empty() {
                dst.join(name)
            } else {
                dst.clone()
            };
            fs::create_dir_all(&target).map_err(|e| anyhow!("{}: {e}", target.display()))?;
            extract(reader, &target)
        }
        Location::Remote { .. } => unreachable!("checked by cp_cmd"),
    }
}

/// Streams a session file into a local file (or stdout). The data goes to a temporary
/// file next to the target, renamed at the end: a failed copy leaves no half file
/// and does not clobber an existing one.
fn save_file(response: Response<Body>, path: &str, dst: &Location) -> Result<()> {
    let mut reader = response.into_body().into_reader();
    let dst = match dst {
        Location::Stdio => {
            io::copy(&mut reader, &mut io::stdout().lock()).context("writing to stdout")?;
            return Ok(());
        }
        Location::Local(dst) => dst,
        Location::Remote { .. } => unreachable!("checked by cp_cmd"),
    };
    let target = if dst.is_dir() || dst.as_os_str().to_string_lossy().ends_with('/') {
        match remote_name(path) {
            "" => bail!("{path}: not a file"),
            name => dst.join(name),
        }
    } else {
        dst.clone()
    };
    let dir = match target.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let file_name = target.file_name().unwrap_or_default().to_string_lossy();
    let partial = dir.join(format!(".{file_name}.brig-partial.{}", std::process::id()));
    let result = (|| -> Result<()> {
        let mut file = File::create(&partial).map_err(|e| anyhow!("{}: {e}", partial.display()))?;
        io::copy(&mut reader, &mut file).with_context(|| format!("copying {path}"))?;
        file.sync_all()?;
        fs::rename(&partial, &target).map_err(|e| anyhow!("{}: {e}", target.display()))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&partial);
    }
    result
}

/// Extracts a tar from a session beneath `target`. The archive comes from untrusted
/// code: absolute paths and `..` are refused outright, and the tar crate's
/// `unpack_in` also refuses to write through symlinks leading out of `target`.
/// Device files and FIFOs are skipped (never created on the host, even as root).
fn extract(reader: impl Read, target: &Path) -> Result<()> {
    let target = target
        .canonicalize()
        .map_err(|e| anyhow!("{}: {e}", target.display()))?;
    let mut archive = tar::Archive::new(reader);
    archive.set_preserve_ownerships(false);
    for entry in archive.entries().context("reading the archive")? {
        let mut entry = entry.context("reading the archive")?;
        let name = entry.path()?.into_owned();
        check_entry_path(&name)?;
        use tar::EntryType::*;
        match entry.header().entry_type() {
            Regular | Directory | Symlink | Continuous | GNUSparse => {}
            // Metadata entries (pax, GNU long names) that the tar crate leaves in.
            XGlobalHeader | XHeader | GNULongName | GNULongLink => continue,
            Link => {
                if let Some(link) = entry.link_name()? {
                    check_entry_path(&link)?;
                }
            }
            other => {
                eprintln!("brig: skipped {}: a {other:?} entry", name.display());
                continue;
            }
        }
        if !entry
            .unpack_in(&target)
            .with_context(|| format!("extracting {}", name.display()))?
        {
            bail!("refusing archive entry '{}'", name.display());
        }
    }
    Ok(())
}

fn check_entry_path(path: &Path) -> Result<()> {
    let escapes = path.components().any(|c| {
        matches!(
            c,
            Component::RootDir | Component::Prefix(_) | Component::ParentDir
        )
    });
    if escapes {
        bail!(
            "refusing archive entry '{}': absolute or with '..'",
            path.display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(text: &str) -> Vec<SseEvent> {
        let mut reader = SseReader::new(text.as_bytes());
        let mut out = Vec::new();
        while let Some(event) = reader.next_event().unwrap() {
            out.push(event);
        }
        out
    }

    fn ev(event: &str, data: &str) -> SseEvent {
        SseEvent {
            event: event.into(),
            data: data.into(),
        }
    }

    #[test]
    fn sse_events_in_order() {
        let text = "event: stdout\ndata: {\"data\":\"a\"}\n\n\
                    event: stderr\ndata: {\"data\":\"b\"}\n\n\
                    event: exit\ndata: {\"exit_code\":0}\n\n";
        assert_eq!(
            events(text),
            vec![
                ev("stdout", r#"{"data":"a"}"#),
                ev("stderr", r#"{"data":"b"}"#),
                ev("exit", r#"{"exit_code":0}"#),
            ]
        );
    }

    #[test]
    fn sse_details() {
        // CRLF lines, comments, no space after the colon, multi-line data, ignored
        // fields, the default event type, an event without data, and an unterminated
        // event at the end (dropped).
        let text = ": keep-alive\r\n\r\n\
                    event:stdout\r\ndata:x\r\nid: 7\r\nretry: 10\r\n\r\n\
                    data: one\ndata:  two\ndata\n\n\
                    event: nothing\n\n\
                    event: exit\ndata: {}";
        assert_eq!(
            events(text),
            vec![ev("stdout", "x"), ev("message", "one\n two\n")]
        );
        assert!(events("").is_empty());
    }

    /// A server that never ends a line cannot make the client hold all it sends.
    #[test]
    fn an_endless_event_is_an_error_not_a_heap() {
        let endless = std::io::repeat(b'x').take(MAX_EVENT_BYTES + (1 << 20));
        let mut reader = SseReader::new(BufReader::new(b"data: ".chain(endless)));
        let err = reader.next_event().unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
        assert!(reader.line.len() as u64 <= MAX_EVENT_BYTES + 1);
        // Keep-alives between events do not add up.
        let mut keepalives = b": keep-alive\n\n".repeat((MAX_EVENT_BYTES / 14 + 10) as usize);
        keepalives.extend_from_slice(b"event: exit\ndata: {}\n\n");
        let mut reader = SseReader::new(&keepalives[..]);
        assert_eq!(reader.next_event().unwrap(), Some(ev("exit", "{}")));
    }

    #[test]
    fn messages_reach_the_terminal_without_control_characters() {
        assert_eq!(
            one_line("no\x1b]0;owned\x07 such\n session\u{9b}2J"),
            "no\\u{1b}]0;owned\\u{7} such session\\u{9b}2J"
        );
    }

    fn env_of(pairs: &[(&str, String)]) -> impl Fn(&str) -> Option<String> {
        let map: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn settings_precedence() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        fs::create_dir_all(home.join(".config/brig")).unwrap();
        fs::write(
            home.join(".config/brig/client.toml"),
            "url = \"http://file:1\"\napi_key = \"file-key\"\n",
        )
        .unwrap();
        let data = dir.path().join("data");
        fs::create_dir_all(&data).unwrap();
        let home_s = home.to_string_lossy().to_string();
        let data_s = data.to_string_lossy().to_string();
        let flags = ConnArgs {
            url: Some("http://flag:1/".into()),
            api_key: Some("flag-key".into()),
        };
        let none = ConnArgs::default();
        let full_env = env_of(&[
            ("HOME", home_s.clone()),
            ("BRIG_DATA_DIR", data_s.clone()),
            ("BRIG_URL", "http://env:1".into()),
            ("BRIG_API_KEY", "env-key".into()),
        ]);
        // Flags beat everything (and the trailing slash goes).
        let s = Settings::resolve(&flags, &full_env).unwrap();
        assert_eq!(s.url, "http://flag:1");
        assert_eq!(s.api_key.as_deref(), Some("flag-key"));
        // Then the environment.
        let s = Settings::resolve(&none, &full_env).unwrap();
        assert_eq!(
            (s.url.as_str(), s.api_key.as_deref()),
            ("http://env:1", Some("env-key"))
        );
        // Then the config file; each setting on its own.
        let env = env_of(&[
            ("HOME", home_s.clone()),
            ("BRIG_DATA_DIR", data_s.clone()),
            ("BRIG_API_KEY", "env-key".into()),
        ]);
        let s = Settings::resolve(&none, &env).unwrap();
        assert_eq!(
            (s.url.as_str(), s.api_key.as_deref()),
            ("http://file:1", Some("env-key"))
        );
        // $BRIG_CONFIG beats ~/.config; empty variables count as unset.
        let other = dir.path().join("other.toml");
        fs::write(&other, "url = \"http://other:1\"\n").unwrap();
        fs::write(data.join("admin.key"), "admin-key\n").unwrap();
        let env = env_of(&[
            ("HOME", home_s.clone()),
            ("BRIG_DATA_DIR", data_s.clone()),
            ("BRIG_CONFIG", other.to_string_lossy().into()),
            ("BRIG_URL", String::new()),
        ]);
        let s = Settings::resolve(&none, &env).unwrap();
        // No key anywhere else, but the admin.key is not that daemon's: none.
        assert_eq!(
            (s.url.as_str(), s.api_key.as_deref()),
            ("http://other:1", None)
        );
        // Nothing at all: the default URL, no key.
        let env = env_of(&[(
            "BRIG_DATA_DIR",
            dir.path().join("nope").to_string_lossy().into(),
        )]);
        assert_eq!(
            Settings::resolve(&none, &env).unwrap(),
            Settings {
                url: DEFAULT_URL.into(),
                api_key: None
            }
        );
    }

    #[test]
    fn the_admin_key_goes_only_to_the_daemon_that_wrote_it() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path();
        fs::write(data.join("admin.key"), "admin-key\n").unwrap();
        fs::write(data.join("listen"), "127.0.0.1:7799\n").unwrap();
        let lock = fs::File::create(data.join("daemon.lock")).unwrap();
        let key_for = |url: &str| {
            let env = env_of(&[
                ("BRIG_DATA_DIR", data.to_string_lossy().into()),
                ("BRIG_URL", url.into()),
                ("HOME", data.to_string_lossy().into()),
            ]);
            Settings::resolve(&ConnArgs::default(), &env)
                .unwrap()
                .api_key
        };
        // No daemon holds the data dir: whatever listens there now is not it.
        assert_eq!(key_for("http://127.0.0.1:7799"), None);
        lock.lock().unwrap();
        assert_eq!(
            key_for("http://127.0.0.1:7799").as_deref(),
            Some("admin-key")
        );
        assert_eq!(
            key_for("http://127.0.0.1:7799/").as_deref(),
            Some("admin-key")
        );
        for elsewhere in [
            "http://127.0.0.1:7798",
            "http://127.0.0.2:7799",
            "http://localhost:7799",
            "http://example.com:7799",
            "https://127.0.0.1",
        ] {
            assert_eq!(key_for(elsewhere), None, "{elsewhere}");
        }
        // A daemon on every address is reached on a loopback address.
        fs::write(data.join("listen"), "0.0.0.0:7799\n").unwrap();
        assert_eq!(
            key_for("http://127.0.0.1:7799").as_deref(),
            Some("admin-key")
        );
        assert_eq!(key_for("http://10.1.2.3:7799"), None);
        // ...of its own family: [::1] is free for anyone to bind then.
        assert_eq!(key_for("http://[::1]:7799"), None);
        fs::write(data.join("listen"), "[::]:80\n").unwrap();
        assert_eq!(key_for("http://[::1]").as_deref(), Some("admin-key"));
        // Not yet recorded (a daemon starting): none.
        fs::remove_file(data.join("listen")).unwrap();
        assert_eq!(key_for("http://127.0.0.1:7799"), None);
    }

    #[test]
    fn settings_errors() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().to_string_lossy().to_string();
        let missing = dir.path().join("missing.toml");
        let env = env_of(&[
            ("BRIG_CONFIG", missing.to_string_lossy().into()),
            ("BRIG_DATA_DIR", data.clone()),
        ]);
        let e = Settings::resolve(&ConnArgs::default(), &env).unwrap_err();
        assert!(e.to_string().contains("missing.toml"), "{e}");
        // A broken file that is not needed is not read.
        let flags = ConnArgs {
            url: Some("http://x:1".into()),
            api_key: Some("k".into()),
        };
        assert!(Settings::resolve(&flags, &env).is_ok());
        let bad = dir.path().join("bad.toml");
        fs::write(&bad, "urll = \"http://x\"\n").unwrap();
        let env = env_of(&[
            ("BRIG_CONFIG", bad.to_string_lossy().into()),
            ("BRIG_DATA_DIR", data),
        ]);
        let e = Settings::resolve(&ConnArgs::default(), &env).unwrap_err();
        assert!(e.to_string().contains("urll"), "{e}");
        let flags = ConnArgs {
            url: Some("127.0.0.1:7700".into()),
            api_key: Some("k".into()),
        };
        let e = Settings::resolve(&flags, &env_of(&[])).unwrap_err();
        assert!(e.to_string().contains("bad daemon URL"), "{e}");
    }

    #[test]
    fn locations() {
        let remote = |s: &str, p: &str| Location::Remote {
            session: s.into(),
            path: p.into(),
        };
        assert_eq!(
            Location::parse("s1:/workspace/a").unwrap(),
            remote("s1", "/workspace/a")
        );
        assert_eq!(Location::parse("s1:/").unwrap(), remote("s1", "/"));
        assert_eq!(Location::parse("s1:/a:b").unwrap(), remote("s1", "/a:b"));
        assert_eq!(Location::parse("-").unwrap(), Location::Stdio);
        for local in ["file.txt", "./a:b", "/abs/x:y", "dir/", ":/x"] {
            assert_eq!(
                Location::parse(local).unwrap(),
                Location::Local(local.into()),
                "{local}"
            );
        }
        assert!(Location::parse("s1:relative").is_err());
        assert!(Location::parse("s1:").is_err());
        assert!(Location::parse("").is_err());
        assert_eq!(remote_name("/workspace/out/"), "out");
        assert_eq!(remote_name("/"), "");
        assert_eq!(remote_join("/", "a"), "/a");
        assert_eq!(remote_join("/workspace/", "a"), "/workspace/a");
    }

    #[test]
    fn exit_statuses() {
        let status = |v: Value| exit_status(&v, Some(500)).0;
        assert_eq!(status(json!({"exit_code": 0, "signal": null})), 0);
        assert_eq!(status(json!({"exit_code": 3})), 3);
        assert_eq!(status(json!({"exit_code": null, "signal": 15})), 143);
        let (code, message) = exit_status(
            &json!({"exit_code": null, "signal": 9, "timed_out": true}),
            Some(500),
        );
        assert_eq!(code, 124);
        assert_eq!(
            message.unwrap(),
            "timed out after 500ms; the command was killed"
        );
        let (code, message) = exit_status(
            &json!({"exit_code": null, "signal": 9, "oom_killed": true}),
            None,
        );
        assert_eq!(
            (code, message.unwrap().as_str()),
            (137, "killed: out of memory")
        );
        let (code, message) = exit_status(
            &json!({"exit_code": null, "signal": 9, "file_locks_exceeded": true}),
            None,
        );
        assert_eq!(code, 137);
        assert!(message.unwrap().contains("file locks"));
        let (code, message) = exit_status(
            &json!({"exit_code": 127, "error": "command not found: x"}),
            None,
        );
        assert_eq!(
            (code, message.unwrap().as_str()),
            (127, "command not found: x")
        );
        assert_eq!(status(json!({})), EXIT_BRIG_ERROR);
    }

    #[test]
    fn helpers() {
        assert_eq!(seg("ab-c_1.~"), "ab-c_1.~");
        assert_eq!(seg("a/b?c d"), "a%2Fb%3Fc%20d");
        assert!(pairs("env", &["A=1".into(), "B=x=y".into()]).is_ok());
        assert!(pairs("env", &["=1".into()]).is_err());
        assert!(pairs("env", &["A".into()]).is_err());
        assert_eq!(
            table(&["A", "BB"], &[vec!["xyz".into(), "1".into()]]),
            "A    BB\nxyz  1\n"
        );
        assert!(check_entry_path(Path::new("a/b")).is_ok());
        assert!(check_entry_path(Path::new("/etc/passwd")).is_err());
        assert!(check_entry_path(Path::new("a/../../b")).is_err());
    }

    #[test]
    fn tar_pipe_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        fs::create_dir_all(src.join("sub/deep")).unwrap();
        fs::write(src.join("a.txt"), "a").unwrap();
        fs::write(src.join("sub/deep/b.bin"), vec![7u8; 300_000]).unwrap();
        std::os::unix::fs::symlink("../a.txt", src.join("sub/link")).unwrap();
        let (tx, rx) = sync_channel(2);
        let root = src.clone();
        let writer = std::thread::spawn(move || {
            let mut out = ChunkWriter::new(tx.clone());
            write_tar(&root, &mut out)
                .and_then(|_| out.flush())
                .unwrap();
            // As in `upload_dir`: the reader may be gone already, having read the
            // archive's end blocks, which is all `extract` needs.
            let _ = tx.send(Ok(None));
        });
        let dst = dir.path().join("dst");
        fs::create_dir(&dst).unwrap();
        extract(ChunkReader::new(rx), &dst).unwrap();
        writer.join().unwrap();
        assert_eq!(fs::read(dst.join("a.txt")).unwrap(), b"a");
        assert_eq!(fs::read(dst.join("sub/deep/b.bin")).unwrap().len(), 300_000);
        assert_eq!(
            fs::read_link(dst.join("sub/link")).unwrap(),
            Path::new("../a.txt")
        );
        // A writer that stops without the end mark is an error, not a short archive.
        let (tx, rx) = sync_channel(1);
        tx.send(Ok(Some(b"partial".to_vec()))).unwrap();
        drop(tx);
        let mut data = Vec::new();
        assert!(ChunkReader::new(rx).read_to_end(&mut data).is_err());
    }
}
