//! The flags of `brig serve`, parsed by clap with brig's own units (`512M`, `30s`)
//! so that a bad value is refused before anything starts, and converted into the
//! engine's [`Config`], whose `validate` checks the rules that span several flags.

use std::net::SocketAddr;
use std::path::PathBuf;

use brig_jail::ids::IdRange;

pub use brig_engine::config::Config;

/// `brig serve`: sandboxes as a service over HTTP.
///
/// Sizes are in bytes (`*_bytes`) and durations in milliseconds (`*_ms`), parsed
/// from brig's units (`512M`, `30s`). Global caps are `usize` (they are compared
/// with in-memory counts); per-tenant defaults are `u64` like the quotas they seed.
#[derive(clap::Args, Clone, Debug)]
pub struct ServeArgs {
    /// Address to listen on (IP:PORT).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7700")]
    pub listen: SocketAddr,
    /// Directory for the daemon's state: database, uploaded files, admin key.
    #[arg(long, value_name = "DIR", default_value = "/var/lib/brig-server")]
    pub data_dir: PathBuf,
    /// The image store.
    #[arg(
        long,
        value_name = "DIR",
        env = "BRIG_STORE",
        default_value = "/var/lib/brig",
        value_parser = brig_image::store::absolute_store_path
    )]
    pub store: PathBuf,
    /// Serve without API keys: every request without a key is tenant "default".
    /// Allowed only on a loopback listen address.
    #[arg(long)]
    pub no_auth: bool,
    /// Image used by /v1/execute. Missing from the store at start, it is built in
    /// the background (from --default-image-recipe, or for `python` the recipe
    /// compiled in: images/python.toml); /v1/execute answers 503 meanwhile.
    #[arg(long, value_name = "NAME", default_value = "python")]
    pub default_image: String,
    /// Do not build a missing --default-image at start.
    #[arg(long = "no-build-default-image", action = clap::ArgAction::SetFalse)]
    pub build_default_image: bool,
    /// The recipe a missing --default-image is built from [default: for `python`,
    /// images/python.toml, compiled in].
    #[arg(long, value_name = "RECIPE.toml")]
    pub default_image_recipe: Option<PathBuf>,
    /// Image for sessions that name none [default: the host's read-only system dirs].
    #[arg(long, value_name = "NAME")]
    pub default_session_image: Option<String>,
    /// Captured output per stream and exec (e.g. 1M).
    #[arg(long = "output-limit", value_name = "SIZE", default_value = "1M", value_parser = size)]
    pub output_limit_bytes: u64,
    /// Largest JSON request body.
    #[arg(long = "max-body", value_name = "SIZE", default_value = "10M", value_parser = size)]
    pub max_body_bytes: u64,
    /// Largest uploaded file (/v1/files, and files written into a session).
    #[arg(
        long = "max-file-size",
        alias = "max-file-bytes",
        value_name = "SIZE",
        default_value = "100M",
        value_parser = size
    )]
    pub max_file_size_bytes: u64,
    /// How long uploaded files are kept.
    #[arg(long = "file-ttl", value_name = "DURATION", default_value = "24h", value_parser = duration_ms)]
    pub file_ttl_ms: u64,
    /// Longest timeout an exec or /v1/execute request may ask for.
    #[arg(
        long = "max-execute-timeout",
        value_name = "DURATION",
        default_value = "60s",
        value_parser = duration_ms
    )]
    pub max_execute_timeout_ms: u64,
    /// Live sessions, all tenants together.
    #[arg(long, value_name = "N", default_value_t = 2000)]
    pub max_sessions: usize,
    /// Concurrent execs, all tenants together. File transfers (uploads, archive
    /// downloads, listings) and process output streams are capped the same way, each
    /// counted apart (transfers at most 128).
    #[arg(long, value_name = "N", default_value_t = 256)]
    pub max_concurrent_execs: usize,
    /// Background processes running at once, all tenants together. Each holds two
    /// of the daemon's descriptors while it runs, so this is also held to an eighth
    /// of the open-file limit.
    #[arg(long, value_name = "N", default_value_t = 2048)]
    pub max_processes: usize,
    /// Snapshots being taken at once, all tenants together. Each copies and packs
    /// up to a session's disk with the host's CPU and disk.
    #[arg(long, value_name = "N", default_value_t = 4)]
    pub max_snapshots: u64,
    /// Client connections open at once; more wait in the listen backlog until one
    /// closes. Held to a quarter of the open-file limit (raised to its hard limit at
    /// start), so connections cannot take the descriptors sandboxes need.
    #[arg(long, value_name = "N", default_value_t = 4096)]
    pub max_connections: usize,
    /// How long a client may take to send a request's headers, counted from when the
    /// daemon waits for them (so it bounds an idle kept-alive connection too); the
    /// connection is closed after that.
    #[arg(
        long = "header-timeout",
        value_name = "DURATION",
        default_value = "30s",
        value_parser = duration_ms
    )]
    pub header_timeout_ms: u64,
    /// How long a transfer may stall before the daemon gives up on it: an upload's
    /// body (no bytes from the client), any response (none read by the client: the
    /// connection is closed), a process's stdin (none taken by the process).
    #[arg(
        long = "body-timeout",
        value_name = "DURATION",
        default_value = "60s",
        value_parser = duration_ms
    )]
    pub body_timeout_ms: u64,
    /// The most memory a session may ask for (`limits.memory`).
    #[arg(long = "max-session-memory", value_name = "SIZE", default_value = "16G", value_parser = size)]
    pub max_session_memory_bytes: u64,
    /// The most processes and threads a session may ask for (`limits.pids`).
    #[arg(long = "max-session-pids", value_name = "N", default_value_t = 4096)]
    pub max_session_pids: u64,
    /// The most CPUs a session may ask for (`limits.cpus`; default: the host's).
    #[arg(long = "max-session-cpus", value_name = "N", value_parser = cpus_millis)]
    pub max_session_cpus_millis: Option<u32>,
    /// A volume no session is using at two checks this far apart is unmounted (its
    /// loop device and mount are the host's); the next session that uses it mounts it
    /// again.
    #[arg(
        long = "volume-idle-unmount",
        value_name = "DURATION",
        default_value = "5m",
        value_parser = duration_ms
    )]
    pub volume_idle_unmount_ms: u64,
    /// Default live sessions per tenant.
    #[arg(long, value_name = "N", default_value_t = 100)]
    pub tenant_max_sessions: u64,
    /// Default concurrent execs per tenant.
    #[arg(long, value_name = "N", default_value_t = 16)]
    pub tenant_max_concurrent_execs: u64,
    /// Background processes running at once per tenant.
    #[arg(long, value_name = "N", default_value_t = 256)]
    pub tenant_max_processes: u64,
    /// Snapshots being taken at once per tenant.
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub tenant_max_snapshots: u64,
    /// Default disk per tenant: the disk limit of each live session plus stored files.
    #[arg(long = "tenant-max-disk", value_name = "SIZE", default_value = "10G", value_parser = size)]
    pub tenant_max_disk_bytes: u64,
    /// Default lifetime of a session.
    #[arg(long = "session-ttl", value_name = "DURATION", default_value = "1h", value_parser = duration_ms)]
    pub session_ttl_ms: u64,
    /// Default idle time after which a session is deleted.
    #[arg(
        long = "session-idle-timeout",
        value_name = "DURATION",
        default_value = "15m",
        value_parser = duration_ms
    )]
    pub session_idle_timeout_ms: u64,
    /// How long audit events are kept (e.g. 30d); 0 keeps them forever. Older ones
    /// are removed in the background: export them first (GET /v1/audit?format=jsonl)
    /// to keep them longer elsewhere.
    #[arg(
        long = "audit-retention",
        value_name = "DURATION",
        default_value = "30d",
        value_parser = duration_ms
    )]
    pub audit_retention_ms: u64,
    /// Keep N ready sandboxes of IMAGE ("host" for the host's system dirs). Repeatable.
    #[arg(long, value_name = "IMAGE=N", value_parser = pool_spec)]
    pub pool: Vec<(String, usize)>,
    /// Log format.
    #[arg(long, value_name = "FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Host uid/gid range for sandboxes when running as root (START-END).
    #[arg(long, value_name = "START-END", env = "BRIG_ID_RANGE")]
    pub id_range: Option<IdRange>,
    /// The kind of sandbox sessions run in; hidden while there is one.
    #[arg(long, hide = true, value_name = "KIND", default_value = "namespaces")]
    pub backend: brig_engine::backend::BackendKind,
    /// Sessions' egress proxy resolves names from this hosts file only (air-gapped
    /// installs, tests) instead of the system's resolver.
    #[arg(long, value_name = "FILE")]
    pub egress_hosts: Option<PathBuf>,
    /// Trust the CAs in this PEM file, besides the web's roots, for the upstreams
    /// of TLS that sessions' proxies intercept for their secrets (an internal CA;
    /// tests).
    #[arg(long, value_name = "FILE")]
    pub egress_ca_file: Option<PathBuf>,
    /// Let sessions reach this otherwise forbidden range (an internal mirror).
    /// Repeatable.
    #[arg(long, value_name = "CIDR", value_parser = cidr)]
    pub egress_allow_private: Vec<brig_policy::net::Cidr>,
    /// The network policy of sessions that ask for none, as the API's `network`
    /// object, e.g. '{"mode":"allow","allow":["pypi.org:443"]}'.
    #[arg(long, value_name = "JSON", default_value = r#"{"mode":"none"}"#, value_parser = network)]
    pub session_network: brig_engine::egress::Network,
    /// Cap each session's traffic through its proxy at RATE bytes per second each
    /// way (10M, 512K), across all its connections, after a one-second burst.
    #[arg(long, value_name = "RATE", value_parser = size)]
    pub egress_rate: Option<u64>,
    /// The image of the sandbox each MCP session (`/mcp`) gets [default: as
    /// --default-session-image].
    #[arg(long, value_name = "NAME")]
    pub mcp_image: Option<String>,
    /// The network policy of MCP sessions' sandboxes, as --session-network's
    /// [default: --session-network].
    #[arg(long, value_name = "JSON", value_parser = network)]
    pub mcp_network: Option<brig_engine::egress::Network>,
    /// An MCP session (`/mcp`) unused this long ends, and its sandbox is deleted.
    #[arg(long = "mcp-idle-timeout", value_name = "DURATION", default_value = "15m", value_parser = duration_ms)]
    pub mcp_idle_timeout_ms: u64,
}

fn cidr(text: &str) -> Result<brig_policy::net::Cidr, String> {
    text.parse()
        .map_err(|e: brig_policy::net::NetPolicyError| e.to_string())
}

fn network(text: &str) -> Result<brig_engine::egress::Network, String> {
    let network: brig_engine::egress::Network =
        serde_json::from_str(text).map_err(|e| format!("invalid network policy: {e}"))?;
    network.normalized().map_err(|e| e.message)
}

/// How log lines are written.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

fn size(text: &str) -> Result<u64, String> {
    brig_policy::parse_size(text).map_err(|e| e.to_string())
}

fn cpus_millis(text: &str) -> Result<u32, String> {
    brig_policy::parse_cpus_millis(text).map_err(|e| e.to_string())
}

fn duration_ms(text: &str) -> Result<u64, String> {
    brig_policy::parse_duration_ms(text).map_err(|e| e.to_string())
}

/// `IMAGE=N`; the image `host` stands for the host's system dirs.
fn pool_spec(text: &str) -> Result<(String, usize), String> {
    let bad = || format!("invalid pool '{text}': use IMAGE=N, e.g. python=4 or host=2");
    let (image, size) = text.split_once('=').ok_or_else(bad)?;
    let image = image.trim();
    let size: usize = size.trim().parse().map_err(|_| bad())?;
    if image.is_empty() {
        return Err(bad());
    }
    Ok((image.to_string(), size))
}

impl ServeArgs {
    /// Parses `brig serve` flags from an argument list (the first item is the program
    /// name); used by tests and by anything that embeds the daemon.
    pub fn try_parse_from<I, T>(args: I) -> Result<ServeArgs, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: ServeArgs,
        }
        <Cli as clap::Parser>::try_parse_from(args).map(|cli| cli.args)
    }
}

/// Every flag but `--log-format`, which is the server's alone (it sets up logging
/// before there is an engine).
impl From<ServeArgs> for Config {
    fn from(args: ServeArgs) -> Config {
        let ServeArgs {
            listen,
            data_dir,
            store,
            no_auth,
            default_image,
            build_default_image,
            default_image_recipe,
            default_session_image,
            output_limit_bytes,
            max_body_bytes,
            max_file_size_bytes,
            file_ttl_ms,
            max_execute_timeout_ms,
            max_sessions,
            max_concurrent_execs,
            max_processes,
            max_snapshots,
            max_connections,
            header_timeout_ms,
            body_timeout_ms,
            max_session_memory_bytes,
            max_session_pids,
            max_session_cpus_millis,
            volume_idle_unmount_ms,
            tenant_max_sessions,
            tenant_max_concurrent_execs,
            tenant_max_processes,
            tenant_max_snapshots,
            tenant_max_disk_bytes,
            session_ttl_ms,
            session_idle_timeout_ms,
            audit_retention_ms,
            pool,
            log_format: _,
            id_range,
            backend,
            egress_hosts,
            egress_ca_file,
            egress_allow_private,
            session_network,
            egress_rate,
            mcp_image,
            mcp_network,
            mcp_idle_timeout_ms,
        } = args;
        Config {
            listen,
            data_dir,
            store,
            no_auth,
            default_image,
            build_default_image,
            default_image_recipe,
            default_session_image,
            output_limit_bytes,
            max_body_bytes,
            max_file_size_bytes,
            file_ttl_ms,
            max_execute_timeout_ms,
            max_sessions,
            max_concurrent_execs,
            max_processes,
            max_snapshots,
            max_connections,
            header_timeout_ms,
            body_timeout_ms,
            max_session_memory_bytes,
            max_session_pids,
            max_session_cpus_millis,
            volume_idle_unmount_ms,
            tenant_max_sessions,
            tenant_max_concurrent_execs,
            tenant_max_processes,
            tenant_max_snapshots,
            tenant_max_disk_bytes,
            session_ttl_ms,
            session_idle_timeout_ms,
            audit_retention_ms,
            pool,
            id_range,
            backend,
            egress_hosts,
            egress_ca_file,
            egress_allow_private,
            session_network,
            egress_rate,
            mcp_image,
            mcp_network,
            mcp_idle_timeout_ms,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(extra: &[&str]) -> Result<ServeArgs, clap::Error> {
        let mut argv = vec!["brig-serve"];
        argv.extend_from_slice(extra);
        ServeArgs::try_parse_from(argv)
    }

    fn config(extra: &[&str]) -> Config {
        parse(extra).unwrap().into()
    }

    #[test]
    fn a_relative_store_is_made_absolute() {
        let args = parse(&["--store", "store"]).unwrap();
        assert_eq!(args.store, std::env::current_dir().unwrap().join("store"));
    }

    #[test]
    fn defaults() {
        let args = parse(&[]).unwrap();
        assert_eq!(args.listen, "127.0.0.1:7700".parse().unwrap());
        assert_eq!(args.data_dir, PathBuf::from("/var/lib/brig-server"));
        assert!(!args.no_auth);
        assert_eq!(args.default_image, "python");
        assert_eq!(args.default_session_image, None);
        assert_eq!(args.output_limit_bytes, 1 << 20);
        assert_eq!(args.max_body_bytes, 10 << 20);
        assert_eq!(args.max_file_size_bytes, 100 << 20);
        assert_eq!(args.file_ttl_ms, 24 * 3600 * 1000);
        assert_eq!(args.max_execute_timeout_ms, 60_000);
        assert_eq!(args.max_sessions, 2000);
        assert_eq!(args.max_concurrent_execs, 256);
        assert_eq!(args.tenant_max_sessions, 100);
        assert_eq!(args.tenant_max_concurrent_execs, 16);
        assert_eq!(args.tenant_max_disk_bytes, 10 << 30);
        assert_eq!(args.session_ttl_ms, 3_600_000);
        assert_eq!(args.session_idle_timeout_ms, 900_000);
        assert_eq!(args.audit_retention_ms, 30 * 24 * 3600 * 1000);
        assert_eq!(args.max_connections, 4096);
        assert_eq!(args.header_timeout_ms, 30_000);
        assert_eq!(args.body_timeout_ms, 60_000);
        assert_eq!(
            parse(&["--audit-retention", "0"])
                .unwrap()
                .audit_retention_ms,
            0
        );
        assert!(args.pool.is_empty());
        assert_eq!(args.log_format, LogFormat::Text);
        // The engine's defaults are the flags' (the environment may name a store
        // or an id range).
        let config = Config {
            store: Config::default().store,
            id_range: None,
            ..Config::from(args)
        };
        assert_eq!(config, Config::default());
        config.validate().unwrap();
    }

    #[test]
    fn egress_flags_are_checked_as_they_are_parsed() {
        let config = config(&[
            "--egress-hosts",
            "/etc/brig-hosts",
            "--egress-ca-file",
            "/etc/brig-roots.pem",
            "--egress-allow-private",
            "10.1.0.0/16",
            "--egress-allow-private",
            "127.0.0.0/8",
            "--session-network",
            r#"{"mode":"allow","allow":["PyPI.org:443"]}"#,
        ]);
        assert_eq!(config.egress_hosts, Some(PathBuf::from("/etc/brig-hosts")));
        assert_eq!(
            config.egress_ca_file,
            Some(PathBuf::from("/etc/brig-roots.pem"))
        );
        assert_eq!(config.egress_allow_private.len(), 2);
        assert_eq!(
            config.session_network.allow,
            vec!["pypi.org:443".to_string()]
        );
        for bad in [
            &["--egress-allow-private", "10.1.0.0/99"][..],
            &["--session-network", r#"{"mode":"allow","allow":["a b"]}"#],
            &["--session-network", r#"{"mode":"wide"}"#],
            &["--session-network", "allow"],
        ] {
            let err = parse(bad).unwrap_err().to_string();
            assert!(
                err.contains(bad[1])
                    || err.contains("a b")
                    || err.contains("wide")
                    || err.contains("invalid network policy"),
                "{bad:?}: {err}"
            );
        }
    }

    #[test]
    fn units_and_pools() {
        let args = parse(&[
            "--output-limit",
            "64K",
            "--file-ttl",
            "2s",
            "--pool",
            "python=4",
            "--pool",
            "host=2",
            "--log-format",
            "json",
            "--id-range",
            "10-20",
        ])
        .unwrap();
        assert_eq!(args.output_limit_bytes, 64 << 10);
        assert_eq!(args.file_ttl_ms, 2_000);
        assert_eq!(
            args.pool,
            vec![("python".to_string(), 4), ("host".to_string(), 2)]
        );
        let alias = parse(&["--max-file-bytes", "1K"]).unwrap();
        assert_eq!(alias.max_file_size_bytes, 1024);
        assert_eq!(args.log_format, LogFormat::Json);
        assert_eq!(args.id_range, Some(IdRange { start: 10, end: 20 }));
        Config::from(args).validate().unwrap();
    }

    #[test]
    fn bad_values_are_refused_by_the_parser() {
        for bad in [
            &["--output-limit", "12Q"][..],
            &["--file-ttl", "1w"],
            &["--pool", "python"],
            &["--pool", "=3"],
            &["--pool", "python=-1"],
            &["--listen", "localhost"],
            &["--log-format", "xml"],
            &["--id-range", "5"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn cross_flag_rules() {
        for bad in [
            &["--max-sessions", "0"][..],
            &["--file-ttl", "0s"],
            &["--max-body", "0"],
            &["--pool", "python=3", "--pool", "python=1"],
            &["--pool", "python=3", "--max-sessions", "2"],
            &["--default-image", " "],
            &["--max-processes", "0"],
            &["--volume-idle-unmount", "0s"],
            // Caps below what a session that asks for nothing gets.
            &["--max-session-memory", "256M"],
            &["--max-session-pids", "100"],
            &["--max-session-cpus", "0.5"],
        ] {
            assert!(config(bad).validate().is_err(), "{bad:?} should be refused");
        }
        config(&["--max-session-memory", "512M", "--max-session-pids", "256"])
            .validate()
            .unwrap();
    }
}
