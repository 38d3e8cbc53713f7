//! brig: a self-hosted sandbox for untrusted code. This binary is a thin client:
//! it parses flags into a `brig_policy::SandboxSpec` and hands it to `brig_jail`.

use std::path::PathBuf;
use std::process::ExitCode;

use brig_jail::{HostConfig, Outcome, Stdio};
use brig_policy::net::{EgressMode, EgressPolicy};
use brig_policy::{
    parse_cpus_millis, parse_duration_ms, parse_size, BindMount, Identity, LandlockMode,
    NetworkMode, RootSource, SandboxSpec, SeccompMode,
};
use clap::{Args, Parser, Subcommand};

/// `println!` for brig's own output: a reader that went away (`brig image ls |
/// head`) ends brig quietly with status 141, as it would a shell tool, where
/// `println!` panics.
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::print_line(format_args!($($arg)*))
    };
}

mod build_cmd;
mod client_cmd;
mod image_cmd;
mod mcp_cmd;
mod mcp_daemon;

/// Exit status for brig's own errors (bad flag, setup failure), as in `docker run`.
pub(crate) const EXIT_BRIG_ERROR: u8 = 125;
/// Exit status when the timeout fired, as in timeout(1).
const EXIT_TIMEOUT: u8 = 124;

#[derive(Parser)]
#[command(
    name = "brig",
    version,
    about = "Run untrusted code in a fresh, fully isolated Linux sandbox"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    Run(Box<RunArgs>),
    /// Manage images: read-only root filesystems made of stacked layers.
    Image(image_cmd::ImageArgs),
    /// Run the daemon: an HTTP API for sessions, exec, files, snapshots (docs/API.md).
    Serve(Box<brig_server::ServeArgs>),
    /// Manage sessions on a brig daemon (`brig serve`): sandboxes that live between requests.
    Session(client_cmd::SessionArgs),
    /// Run a command in a session, streaming its output; exits with its status.
    Exec(client_cmd::ExecArgs),
    /// Run Python in a session's stateful interpreter (from FILE or stdin): its
    /// variables stay for the next call.
    Code(client_cmd::CodeArgs),
    /// Copy files and directories between here and a session (SESSION:/path).
    Cp(client_cmd::CpArgs),
    /// Manage the daemon's API keys.
    Key(client_cmd::KeyArgs),
    /// See tenants' quotas and usage on the daemon; set quotas.
    Tenant(client_cmd::TenantArgs),
    /// Serve MCP over stdio: a sandbox as tools for an agent
    /// (`claude mcp add brig -- brig mcp`).
    Mcp(mcp_cmd::McpArgs),
}

/// Run a command in a brand-new sandbox and report its result.
#[derive(Args)]
struct RunArgs {
    /// Capture stdout/stderr and print one JSON object with the result when the command ends.
    #[arg(long)]
    json: bool,

    /// Wall-clock limit (e.g. 30s, 500ms, 2m; "none" for no limit). Kills the whole process tree.
    #[arg(long, value_name = "DURATION", default_value = "60s")]
    timeout: String,
    /// CPU seconds per process (RLIMIT_CPU).
    #[arg(long, value_name = "SECS")]
    cpu_time: Option<u64>,
    /// Memory for the whole sandbox, tmpfs included, no swap (e.g. 512M; "none").
    #[arg(long, value_name = "SIZE", default_value = "512M")]
    memory: String,
    /// Maximum number of processes and threads ("none" for no limit).
    #[arg(long, value_name = "N", default_value = "256")]
    pids: String,
    /// CPU bandwidth in CPUs, fractional allowed (e.g. 0.5; "none").
    #[arg(long, value_name = "N", default_value = "1")]
    cpus: String,
    /// Size of all writable storage together: /tmp, /workspace, /dev/shm.
    #[arg(long, value_name = "SIZE", default_value = "512M")]
    disk: String,
    /// Bytes kept of each captured stream with --json; the rest is cut and marked truncated.
    #[arg(long, value_name = "SIZE", default_value = "1M")]
    output_limit: String,
    /// Open file descriptors per process.
    #[arg(long, value_name = "N", default_value_t = brig_policy::defaults::NOFILE)]
    nofile: u64,
    /// Largest file a process may write.
    #[arg(long, value_name = "SIZE")]
    file_size: Option<String>,

    /// Run from this image (see `brig image`): its layers are the root, writable
    /// through a private upper layer limited by --disk; its env, user, workdir and
    /// command are the defaults.
    #[arg(long, value_name = "NAME", conflicts_with_all = ["rootfs", "layer"])]
    image: Option<String>,
    /// When the command ends, store what it wrote (files, changes, deletions) as a
    /// new layer on top of --image, giving image NAME.
    #[arg(long, value_name = "NAME", requires = "image")]
    snapshot_to: Option<String>,
    /// Replace the --snapshot-to image if it exists.
    #[arg(long, requires = "snapshot_to")]
    replace: bool,
    #[command(flatten)]
    store: image_cmd::StoreArgs,

    /// Use this directory tree as / (read-only) instead of the host's system directories.
    #[arg(long, value_name = "DIR")]
    rootfs: Option<PathBuf>,
    /// Stack this host directory as a read-only layer of a writable overlay root
    /// (bottom first). Repeatable. `--image` does this with an image's layers.
    #[arg(long, value_name = "DIR", conflicts_with = "rootfs")]
    layer: Vec<PathBuf>,
    /// Make a host path visible inside: SRC:DST[:ro|rw], read-only by default. Repeatable.
    #[arg(long, value_name = "SRC:DST[:ro|rw]")]
    bind: Vec<String>,
    /// Bind this host directory read-write at /workspace instead of a private tmpfs.
    #[arg(long, value_name = "DIR")]
    workspace: Option<PathBuf>,
    /// Working directory inside the sandbox [default: the image's, else /workspace].
    #[arg(long, value_name = "PATH")]
    cwd: Option<String>,

    /// Set an environment variable (KEY=VALUE). Repeatable. The environment is otherwise
    /// cleared except PATH, HOME and LANG.
    #[arg(long, value_name = "KEY=VALUE")]
    env: Vec<String>,
    #[arg(long, value_name = "NAME", default_value = brig_policy::defaults::HOSTNAME)]
    hostname: String,
    /// uid[:gid] inside the sandbox; 0 is root of the sandbox's user namespace only
    /// [default: 1000; with --image the image's user, else 0].
    #[arg(long, value_name = "UID[:GID]")]
    user: Option<String>,

    /// Network mode: "none" is loopback only; "allow" reaches only the --allow-host
    /// hosts, "open" any public address, both through brig's proxy (HTTP_PROXY,
    /// ALL_PROXY, DNS, and capture of TCP to names it resolved). No mode reaches
    /// loopback, private, link-local, CGNAT, multicast or metadata addresses.
    #[arg(long, value_name = "MODE", default_value = "none")]
    network: String,
    /// With --network allow: a host the sandbox may reach, PATTERN[:PORTS] (example.com,
    /// *.example.com, an IP or a CIDR; ports 443, 80,443 or 8000-9000). Repeatable.
    #[arg(long, value_name = "PATTERN[:PORTS]")]
    allow_host: Vec<String>,
    /// A host the sandbox may not reach, PATTERN[:PORTS]; wins over --allow-host. Repeatable.
    #[arg(long, value_name = "PATTERN[:PORTS]")]
    deny_host: Vec<String>,
    /// Operator: resolve names for the proxy from this hosts file only (air-gapped
    /// installs, tests) instead of the system's resolver.
    #[arg(long, value_name = "FILE")]
    egress_hosts: Option<PathBuf>,
    /// Operator: let sandboxes reach this otherwise forbidden range (an internal
    /// mirror). Repeatable.
    #[arg(long, value_name = "CIDR")]
    egress_allow_private: Vec<String>,
    /// A secret the sandbox never sees: the value is taken from brig's own
    /// environment variable NAME; inside, NAME holds a placeholder that brig's proxy
    /// replaces by the value in requests to HOST (example.com, *.example.com) only,
    /// intercepting their TLS. A placeholder sent elsewhere is refused. Repeatable.
    #[arg(long, value_name = "NAME@HOST[,HOST...]")]
    secret: Vec<String>,
    /// Operator: trust the CAs in this PEM file, besides the web's roots, for the
    /// upstreams of TLS that brig intercepts for --secret (an internal CA; tests).
    #[arg(long, value_name = "FILE")]
    egress_ca_file: Option<PathBuf>,
    /// Cap the sandbox's traffic through brig's proxy at RATE bytes per second each
    /// way (10M, 512K), across all its connections, after a burst of one second's worth.
    #[arg(long, value_name = "RATE")]
    egress_rate: Option<String>,
    /// seccomp filter: default or off.
    #[arg(long, value_name = "MODE", default_value = "default")]
    seccomp: SeccompMode,
    /// Allow ptrace and process_vm_* among the sandbox's own processes (debuggers).
    #[arg(long)]
    allow_ptrace: bool,
    /// Landlock: required (refuse to run unless fully enforced), best-effort or off.
    #[arg(long, value_name = "MODE", default_value = "best-effort")]
    landlock: LandlockMode,

    /// Host uid/gid range for sandboxes when brig runs as root (START-END).
    #[arg(long, value_name = "START-END", env = "BRIG_ID_RANGE")]
    id_range: Option<brig_jail::ids::IdRange>,
    /// Parent cgroup for sandboxes, relative to each hierarchy's root.
    #[arg(long, value_name = "PATH", env = "BRIG_CGROUP_PARENT")]
    cgroup_parent: Option<String>,

    /// The command and its arguments (with --image, the image's command by default).
    #[arg(last = true, value_name = "CMD")]
    command: Vec<String>,
}

fn optional<T>(
    text: &str,
    parse: impl Fn(&str) -> Result<T, brig_policy::PolicyError>,
) -> Result<Option<T>, brig_policy::PolicyError> {
    match text {
        "none" | "unlimited" => Ok(None),
        other => parse(other).map(Some),
    }
}

impl RunArgs {
    fn spec(
        &self,
        image: Option<&image_cmd::ImageInUse>,
        secrets: Option<&RunSecrets>,
    ) -> anyhow::Result<SandboxSpec> {
        let config = image.map(|i| &i.record.config);
        let command = match config {
            Some(config) if self.command.is_empty() => config
                .entrypoint
                .iter()
                .chain(&config.cmd)
                .cloned()
                .collect(),
            _ => self.command.clone(),
        };
        if command.is_empty() {
            anyhow::bail!(brig_policy::PolicyError::EmptyCommand);
        }
        let mut spec = SandboxSpec::new(command);
        let limits = &mut spec.limits;
        limits.timeout_ms = optional(&self.timeout, parse_duration_ms)?;
        limits.cpu_time_secs = self.cpu_time;
        limits.memory_bytes = optional(&self.memory, parse_size)?;
        limits.pids = optional(&self.pids, |t| {
            t.parse()
                .map_err(|_| brig_policy::PolicyError::BadSize(t.to_string()))
        })?;
        limits.cpus_millis = optional(&self.cpus, parse_cpus_millis)?;
        limits.disk_bytes = parse_size(&self.disk)?;
        limits.output_limit_bytes = parse_size(&self.output_limit)?;
        limits.nofile = self.nofile;
        limits.file_size_bytes = self.file_size.as_deref().map(parse_size).transpose()?;

        for entry in &self.env {
            let (key, value) = entry
                .split_once('=')
                .ok_or_else(|| brig_policy::PolicyError::BadEnv(entry.clone()))?;
            spec.env.insert(key.to_string(), value.to_string());
        }
        let user = self.user.as_deref().map(Identity::parse_user).transpose()?;
        spec.identity.hostname.clone_from(&self.hostname);
        if let Some(cwd) = &self.cwd {
            spec.cwd.clone_from(cwd);
        }
        if let Some(dir) = &self.rootfs {
            spec.filesystem.root = RootSource::Directory(absolute(dir)?);
        }
        if let Some(image) = image {
            let chosen = brig_image::Chosen {
                user,
                cwd: self.cwd.clone(),
            };
            image
                .record
                .config
                .apply(&mut spec, &image.layers.mounts, &chosen)
                .map_err(|e| anyhow::anyhow!(e))?;
            spec.filesystem.capture_writes = self.snapshot_to.is_some();
        } else if let Some((uid, gid)) = user {
            spec.identity.uid = uid;
            spec.identity.gid = gid;
        }
        if !self.layer.is_empty() {
            let layers = self
                .layer
                .iter()
                .map(|l| absolute(l))
                .collect::<Result<_, _>>()?;
            spec.filesystem.root = RootSource::Layers(layers);
        }
        for bind in &self.bind {
            let mut bind = BindMount::parse(bind)?;
            bind.source = absolute(&bind.source)?;
            spec.filesystem.binds.push(bind);
        }
        spec.filesystem.workspace = self.workspace.as_deref().map(absolute).transpose()?;
        spec.cwd = brig_policy::normalize_sandbox_path(&spec.cwd)?;
        if self.egress()?.mode != EgressMode::None {
            spec.network = NetworkMode::Egress;
            for (key, value) in brig_net::proxy_env() {
                spec.env.entry(key).or_insert(value);
            }
        }
        if let Some(secrets) = secrets {
            for secret in &secrets.list {
                let name = secret.name().to_string();
                if spec.env.contains_key(&name) {
                    anyhow::bail!("--secret {name}: --env or the image also sets {name}");
                }
                spec.env.insert(name, secret.placeholder().to_string());
            }
            for (key, value) in brig_net::ca_env() {
                spec.env.entry(key).or_insert(value);
            }
            spec.filesystem.extra_ca = Some(secrets.ca.cert_pem().to_string());
        }
        spec.seccomp.mode = self.seccomp;
        spec.seccomp.allow_ptrace = self.allow_ptrace;
        spec.landlock = self.landlock;
        spec.validate()?;
        Ok(spec)
    }

    /// The egress policy of the flags.
    fn egress(&self) -> anyhow::Result<EgressPolicy> {
        let policy = EgressPolicy {
            mode: self.network.parse::<EgressMode>()?,
            allow: parse_all(&self.allow_host)?,
            deny: parse_all(&self.deny_host)?,
            allow_private: parse_all(&self.egress_allow_private)?,
        };
        policy.validate()?;
        let egress_flags = !self.deny_host.is_empty()
            || self.egress_hosts.is_some()
            || !self.egress_allow_private.is_empty()
            || self.egress_rate.is_some();
        if policy.mode == EgressMode::None && egress_flags {
            anyhow::bail!(
                "--deny-host, --egress-hosts, --egress-allow-private and --egress-rate need --network allow or open"
            );
        }
        Ok(policy)
    }

    /// The --secret flags: values from brig's environment, placeholders, and a CA
    /// for this run only. `None` without --secret.
    fn secrets(&self) -> anyhow::Result<Option<RunSecrets>> {
        if self.secret.is_empty() {
            if self.egress_ca_file.is_some() {
                anyhow::bail!("--egress-ca-file is for --secret");
            }
            return Ok(None);
        }
        if self.egress()?.mode == EgressMode::None {
            anyhow::bail!("--secret needs --network allow or open: with none nothing leaves");
        }
        let mut list = Vec::new();
        for flag in &self.secret {
            let (name, hosts) = flag.split_once('@').ok_or_else(|| {
                anyhow::anyhow!("--secret {flag:?}: expected NAME@HOST[,HOST...]")
            })?;
            let value = std::env::var(name).map_err(|_| {
                anyhow::anyhow!(
                    "--secret {name}: brig's environment has no variable {name} to take the value from"
                )
            })?;
            let hosts: Vec<String> = hosts.split(',').map(str::to_string).collect();
            list.push(brig_net::Secret::new(name, value, &hosts)?);
        }
        brig_net::secrets::check_unique(&list)?;
        let upstream_roots = match &self.egress_ca_file {
            Some(path) => brig_net::ca::load_certificates(path)?,
            None => Vec::new(),
        };
        Ok(Some(RunSecrets {
            list,
            ca: std::sync::Arc::new(brig_net::Ca::ephemeral()?),
            upstream_roots,
        }))
    }

    /// The way out for a run with egress: brig's listeners in the sandbox's
    /// namespace, served from this process for the life of the run.
    fn egress_setup(&self, secrets: Option<RunSecrets>) -> anyhow::Result<brig_jail::EgressSetup> {
        use brig_jail::net::{Capture, Listen};
        use brig_net::layout;
        let policy = self.egress()?;
        let resolver = match &self.egress_hosts {
            Some(path) => brig_net::Resolver::from_hosts_file(path)?,
            None => brig_net::Resolver::system()?,
        };
        // Capture needs iproute2 and nftables on the host; without them, programs
        // that ignore the proxy variables reach nothing (no route), which is safe.
        let capture = ["ip", "nft"].iter().all(|tool| on_path(tool));
        if !capture {
            tracing::warn!(
                "egress: 'ip' or 'nft' not found: no transparent capture, only programs that use the proxy variables get out"
            );
        }
        let mut listen = vec![
            Listen::Tcp(layout::HTTP),
            Listen::Tcp(layout::SOCKS),
            Listen::Udp(layout::DNS),
        ];
        if capture {
            listen.push(Listen::Tcp(layout::CAPTURE));
        }
        let egress = brig_net::Egress {
            policy,
            resolver,
            limits: brig_net::Limits {
                bytes_per_second: match &self.egress_rate {
                    Some(rate) => optional(rate, parse_size)
                        .map_err(|e| anyhow::anyhow!("--egress-rate: {e}"))?,
                    None => None,
                },
                ..brig_net::Limits::default()
            },
            events: None,
            secrets: secrets
                .map(|s| brig_net::Secrets {
                    list: s.list,
                    ca: Some(s.ca),
                    upstream_roots: s.upstream_roots,
                })
                .unwrap_or_default(),
        };
        Ok(brig_jail::EgressSetup {
            listen,
            capture: capture.then_some(Capture {
                range: layout::SYNTHETIC,
                to_port: layout::CAPTURE.port(),
            }),
            serve: Box::new(move |fds| serve_egress(egress, fds)),
        })
    }

    fn host(&self) -> HostConfig {
        let mut host = HostConfig::default();
        if let Some(range) = self.id_range {
            host.id_range = range;
        }
        host.cgroup.parent = self.cgroup_parent.clone();
        host
    }
}

/// A run's secrets and the CA that intercepts TLS to their hosts.
struct RunSecrets {
    list: Vec<brig_net::Secret>,
    ca: std::sync::Arc<brig_net::Ca>,
    upstream_roots: Vec<brig_net::ca::CertificateDer>,
}

fn parse_all<T: std::str::FromStr>(texts: &[String]) -> Result<Vec<T>, T::Err> {
    texts.iter().map(|t| t.parse()).collect()
}

fn on_path(tool: &str) -> bool {
    ["/usr/sbin", "/usr/bin", "/sbin", "/bin"]
        .iter()
        .any(|dir| std::path::Path::new(dir).join(tool).is_file())
}

/// The proxy's runtime: started once the sandbox exists (brig_jail::run must
/// clone from a single-threaded process), kept until brig exits.
static EGRESS_RUNTIME: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();

fn serve_egress(egress: brig_net::Egress, fds: Vec<std::os::fd::OwnedFd>) -> Result<(), String> {
    let mut fds = fds.into_iter();
    let mut next = || {
        fds.next()
            .ok_or_else(|| "a listener is missing".to_string())
    };
    let sockets = brig_net::Sockets {
        http: next()?,
        socks: next()?,
        dns: next()?,
        capture: next().ok(),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("brig-egress")
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the proxy's runtime: {e}"))?;
    brig_net::spawn(runtime.handle(), egress, sockets).map_err(|e| e.to_string())?;
    EGRESS_RUNTIME
        .set(runtime)
        .map_err(|_| "the proxy was started twice".to_string())
}

/// Host paths are resolved against the caller's directory and must exist.
fn absolute(path: &std::path::Path) -> anyhow::Result<PathBuf> {
    std::fs::canonicalize(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

/// The exit status and, for abnormal ends, a one-line explanation.
fn exit_status(outcome: &Outcome, spec: &SandboxSpec) -> (u8, Option<String>) {
    if outcome.timed_out {
        let limit = spec.limits.timeout_ms.unwrap_or(0);
        return (
            EXIT_TIMEOUT,
            Some(format!(
                "timed out after {}ms; the sandbox was killed",
                limit
            )),
        );
    }
    if let Some(error) = &outcome.error {
        return (outcome.exit_code.unwrap_or(127) as u8, Some(error.clone()));
    }
    match (outcome.exit_code, outcome.signal) {
        (Some(code), _) => (code as u8, None),
        (None, Some(sig)) if outcome.oom_killed && sig == libc::SIGKILL => {
            let limit = spec
                .limits
                .memory_bytes
                .map(|b| format!(" (limit {} MiB)", b >> 20))
                .unwrap_or_default();
            (
                128 + sig as u8,
                Some(format!("killed: out of memory{limit}")),
            )
        }
        (None, Some(sig)) if outcome.file_locks_exceeded && sig == libc::SIGKILL => (
            128 + sig as u8,
            Some(format!(
                "killed: the sandbox held more than {} file locks (one per 4 KiB of its memory limit)",
                spec.limits.file_lock_budget().unwrap_or(0)
            )),
        ),
        (None, Some(sig)) => (128 + sig as u8, None),
        (None, None) => (
            EXIT_BRIG_ERROR,
            Some("the sandbox ended without a status".into()),
        ),
    }
}

/// See [`outln`].
pub(crate) fn print_line(args: std::fmt::Arguments) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let written = out
        .write_fmt(args)
        .and_then(|()| out.write_all(b"\n"))
        .and_then(|()| out.flush());
    match written {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(128 + 13),
        Err(e) => {
            eprintln!("brig: cannot write to standard output: {e}");
            std::process::exit(EXIT_BRIG_ERROR.into())
        }
    }
}

fn fail(json: bool, code: &str, message: &str) -> ExitCode {
    if json {
        outln!(
            "{}",
            serde_json::json!({"error": {"code": code, "message": message}})
        );
    }
    eprintln!("brig: {message}");
    ExitCode::from(EXIT_BRIG_ERROR)
}

fn run(args: RunArgs) -> ExitCode {
    let image = match &args.image {
        Some(name) => {
            match image_cmd::use_image(&args.store, name, args.snapshot_to.as_deref(), args.replace)
            {
                Ok(image) => Some(image),
                Err(e) => return fail(args.json, e.code(), &e.to_string()),
            }
        }
        None => None,
    };
    let secrets = match args.secrets() {
        Ok(secrets) => secrets,
        Err(e) => return fail(args.json, "invalid_argument", &e.to_string()),
    };
    let spec = match args.spec(image.as_ref(), secrets.as_ref()) {
        Ok(spec) => spec,
        Err(e) => return fail(args.json, "invalid_argument", &e.to_string()),
    };
    let stdio = if args.json {
        Stdio::Capture
    } else {
        Stdio::Inherit
    };
    let launched = if spec.network == NetworkMode::Egress {
        match args.egress_setup(secrets) {
            Ok(setup) => brig_jail::run_with_egress(&spec, &args.host(), stdio, setup),
            Err(e) => return fail(args.json, "invalid_argument", &e.to_string()),
        }
    } else {
        brig_jail::run(&spec, &args.host(), stdio)
    };
    let outcome = match launched {
        Ok(outcome) => outcome,
        Err(e) => return fail(args.json, e.code(), &e.to_string()),
    };
    let (status, message) = exit_status(&outcome, &spec);
    if let (Some(image), Some(new_name), Some(writes)) =
        (&image, &args.snapshot_to, &outcome.writes)
    {
        if let Err(e) =
            image_cmd::snapshot(&args.store, image, new_name, writes, &spec, args.replace)
        {
            return fail(args.json, e.code(), &format!("snapshot: {e}"));
        }
    }
    if args.json {
        match serde_json::to_string(&outcome) {
            Ok(text) => outln!("{text}"),
            Err(e) => return fail(true, "internal", &format!("cannot encode the result: {e}")),
        }
    }
    if let Some(message) = message {
        eprintln!("brig: {message}");
    }
    ExitCode::from(status)
}

fn main() -> ExitCode {
    // A watchdog whose brig died re-executes this binary to clean up.
    brig_jail::watchdog::main_if_requested();
    // The daemon's launch zygote and helper: decided before anything else runs, so
    // the process stays single-threaded (it forks, and clones the sandbox).
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == "__session-zygote")
    {
        return brig_jail::zygote::serve(brig_server::backend::namespaces::launch::helper_main);
    }
    if let Some(Ok(args)) = serve_args() {
        return serve(args);
    }
    init_logging();
    // `brig run` is the hot path: parsed by the run subcommand's parser alone.
    // Building the whole command tree (every subcommand, the daemon's flags) first
    // cost ~0.1 ms of every run.
    let first = std::env::args_os().nth(1);
    if first.as_deref() == Some(std::ffi::OsStr::new("run")) {
        let parsed = run_command()
            .try_get_matches_from(std::env::args_os().skip(1))
            .and_then(|matches| <RunArgs as clap::FromArgMatches>::from_arg_matches(&matches));
        return match parsed {
            Ok(args) => run(args),
            Err(e) => {
                // A caller that asked for JSON parses stdout, bad flags or not.
                let json = std::env::args_os()
                    .skip(2)
                    .take_while(|a| a != "--")
                    .any(|a| a == "--json");
                usage_error(e, json)
            }
        };
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(e, false),
    };
    match cli.command {
        Command::Run(args) => run(*args),
        Command::Image(args) => image_cmd::main(args),
        Command::Session(args) => client_cmd::session(args),
        Command::Exec(args) => client_cmd::exec(args),
        Command::Code(args) => client_cmd::code(args),
        Command::Cp(args) => client_cmd::cp(args),
        Command::Key(args) => client_cmd::key(args),
        Command::Tenant(args) => client_cmd::tenant(args),
        Command::Mcp(args) => mcp_cmd::main(args),
        Command::Serve(_) => unreachable!("handled before logging is set up"),
    }
}

/// The `run` subcommand as the full parser has it, on its own.
fn run_command() -> clap::Command {
    // Named after the binary as invoked, as the full parser names it in usage lines.
    let binary = std::env::args_os()
        .next()
        .map(PathBuf::from)
        .and_then(|path| Some(path.file_name()?.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "brig".into());
    RunArgs::augment_args(clap::Command::new("run").bin_name(format!("{binary} run")))
}

/// Help and version go to stdout with success; anything else is one line on stderr
/// (and, with `json`, the JSON error on stdout).
fn usage_error(e: clap::Error, json: bool) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(
        e.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        let _ = e.print();
        return ExitCode::SUCCESS;
    }
    let rendered = e.render().to_string();
    let first = rendered
        .lines()
        .next()
        .unwrap_or("invalid arguments")
        .trim_start_matches("error: ");
    fail(
        json,
        "invalid_argument",
        &format!("{first} (see brig --help)"),
    )
}

/// Warnings and errors on stderr; `BRIG_LOG` (an env-filter directive) for more. The
/// plain level filter is set up in a fraction of the env filter's time.
fn init_logging() {
    let builder = tracing_subscriber::fmt().with_writer(std::io::stderr);
    match std::env::var("BRIG_LOG") {
        Ok(directives) => builder
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_new(directives)
                    .unwrap_or_else(|_| "warn".into()),
            )
            .init(),
        Err(_) => builder
            .with_max_level(tracing_subscriber::filter::LevelFilter::WARN)
            .init(),
    }
}

/// `brig serve` sets up its own logging (text or JSON), so it is recognised first.
fn serve_args() -> Option<Result<brig_server::ServeArgs, clap::Error>> {
    if std::env::args_os().nth(1).is_none_or(|a| a != "serve") {
        return None;
    }
    Some(Cli::try_parse().map(|cli| match cli.command {
        Command::Serve(args) => *args,
        _ => unreachable!("the first argument is serve"),
    }))
}

fn serve(args: brig_server::ServeArgs) -> ExitCode {
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
    match runtime.block_on(brig_server::server::serve(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("brig: {e:#}");
            ExitCode::from(EXIT_BRIG_ERROR)
        }
    }
}
