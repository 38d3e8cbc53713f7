//! The daemon's settings: the flags of `brig serve`.
//!
//! Sizes and durations are parsed by clap with brig's own units (`512M`, `30s`), so a
//! bad value is refused before anything starts; `ServeArgs::validate` then checks the
//! rules that span several flags.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::bail;
use brig_jail::ids::IdRange;

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
    /// Image used by /v1/execute.
    #[arg(long, value_name = "NAME", default_value = "python")]
    pub default_image: String,
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

/// A size in a JSON request: an integer (bytes) or a string like `"512M"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ByteSize(pub u64);

impl<'de> serde::Deserialize<'de> for ByteSize {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = ByteSize;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a size in bytes or a string like \"512M\"")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<ByteSize, E> {
                Ok(ByteSize(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<ByteSize, E> {
                u64::try_from(v)
                    .map(ByteSize)
                    .map_err(|_| E::custom(format!("invalid size {v}: must not be negative")))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<ByteSize, E> {
                brig_policy::parse_size(v).map(ByteSize).map_err(E::custom)
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

impl serde::Serialize for ByteSize {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u64(self.0)
    }
}

impl utoipa::PartialSchema for ByteSize {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Type};
        OneOfBuilder::new()
            .item(
                ObjectBuilder::new()
                    .schema_type(Type::Integer)
                    .minimum(Some(0)),
            )
            .item(
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .examples(["512M"]),
            )
            .description(Some("bytes, or a binary size such as \"512M\" or \"10G\""))
            .into()
    }
}

impl utoipa::ToSchema for ByteSize {}

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

    /// Checks the rules that involve several flags or that clap cannot express.
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.no_auth && !self.listen.ip().is_loopback() {
            bail!(
                "--no-auth is allowed only on a loopback address (e.g. 127.0.0.1:7700), not {}",
                self.listen
            );
        }
        if self.data_dir.as_os_str().is_empty() {
            bail!("--data-dir must not be empty");
        }
        for (flag, value) in [
            ("--output-limit", self.output_limit_bytes),
            ("--max-body", self.max_body_bytes),
            ("--max-file-size", self.max_file_size_bytes),
            ("--max-sessions", self.max_sessions as u64),
            ("--max-concurrent-execs", self.max_concurrent_execs as u64),
            ("--max-connections", self.max_connections as u64),
            ("--max-processes", self.max_processes as u64),
            ("--tenant-max-processes", self.tenant_max_processes),
            ("--max-snapshots", self.max_snapshots),
            ("--tenant-max-snapshots", self.tenant_max_snapshots),
            ("--max-session-memory", self.max_session_memory_bytes),
            ("--max-session-pids", self.max_session_pids),
            ("--volume-idle-unmount", self.volume_idle_unmount_ms),
            ("--header-timeout", self.header_timeout_ms),
            ("--body-timeout", self.body_timeout_ms),
            ("--file-ttl", self.file_ttl_ms),
            ("--max-execute-timeout", self.max_execute_timeout_ms),
            ("--session-ttl", self.session_ttl_ms),
            ("--session-idle-timeout", self.session_idle_timeout_ms),
        ] {
            if value == 0 {
                bail!("{flag} must be greater than 0");
            }
        }
        // A session that asks for nothing gets brig run's defaults: the caps must
        // leave room for them, or every such create would be refused.
        use brig_policy::defaults;
        if self.max_session_memory_bytes < defaults::MEMORY_BYTES {
            bail!(
                "--max-session-memory must be at least a default session's {} MiB",
                defaults::MEMORY_BYTES >> 20
            );
        }
        if self.max_session_pids < defaults::PIDS {
            bail!(
                "--max-session-pids must be at least a default session's {}",
                defaults::PIDS
            );
        }
        if self
            .max_session_cpus_millis
            .is_some_and(|cpus| cpus < defaults::CPUS_MILLIS)
        {
            bail!(
                "--max-session-cpus must be at least a default session's {}",
                f64::from(defaults::CPUS_MILLIS) / 1000.0
            );
        }
        if self.default_image.trim().is_empty() {
            bail!("--default-image must not be empty");
        }
        let mut seen = std::collections::BTreeSet::new();
        for (image, _) in &self.pool {
            if !seen.insert(image.as_str()) {
                bail!("--pool {image} is given twice");
            }
        }
        let pooled: usize = self.pool.iter().map(|(_, n)| *n).sum();
        if pooled > self.max_sessions {
            bail!(
                "--pool sizes add up to {pooled}, more than --max-sessions {}",
                self.max_sessions
            );
        }
        if self.output_limit_bytes > usize::MAX as u64 || self.max_body_bytes > usize::MAX as u64 {
            bail!("--output-limit and --max-body must fit in memory");
        }
        Ok(())
    }

    /// What the host's shared tables (`kernel.pid_max`, `fs.file-max`, as read from
    /// /proc/sys; `None` if unreadable) let sessions take from everyone else, as
    /// warnings for the log. brig does not change them: they are the host's.
    pub fn host_table_warnings(&self, pid_max: Option<u64>, file_max: Option<u64>) -> Vec<String> {
        let mut warnings = Vec::new();
        let tasks = (self.max_sessions as u64).saturating_mul(self.max_session_pids);
        if let Some(pid_max) = pid_max.filter(|&p| p < PID_MAX_SYSTEMD && p < tasks) {
            warnings.push(format!(
                "kernel.pid_max is {pid_max}, and sessions may start {tasks} tasks together \
                 (--max-sessions x --max-session-pids): should they reach it, no process can \
                 start on the host. Set kernel.pid_max={PID_MAX_SYSTEMD}, as systemd does at boot"
            ));
        }
        if let Some(file_max) = file_max.filter(|&f| f < FILE_MAX_SYSTEMD) {
            let per_session = self.max_session_memory_bytes / BYTES_PER_MAPPED_FILE;
            warnings.push(format!(
                "fs.file-max is {file_max}, and one session may hold about {per_session} open \
                 files (a file a mapping keeps open costs it ~{BYTES_PER_MAPPED_FILE} bytes of \
                 --max-session-memory, and no descriptor): should sessions reach it, only root \
                 can open a file on the host. Set fs.file-max={FILE_MAX_SYSTEMD}, as systemd \
                 does at boot"
            ));
        }
        warnings
    }
}

/// What systemd sets `kernel.pid_max` to at boot on 64-bit hosts (the kernel's most).
const PID_MAX_SYSTEMD: u64 = 4_194_304;
/// What systemd sets `fs.file-max` to at boot: no limit.
const FILE_MAX_SYSTEMD: u64 = i64::MAX as u64;
/// Memory-cgroup bytes a file costs a sandbox that keeps it open only through a
/// mapping (measured on Linux 6.18: a struct file and a VMA).
const BYTES_PER_MAPPED_FILE: u64 = 400;

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(extra: &[&str]) -> Result<ServeArgs, clap::Error> {
        let mut argv = vec!["brig-serve"];
        argv.extend_from_slice(extra);
        ServeArgs::try_parse_from(argv)
    }

    #[test]
    fn host_tables_smaller_than_what_sessions_may_take_are_warned_about() {
        let args = parse(&[]).unwrap();
        // This CI machine's values, without systemd.
        let warnings = args.host_table_warnings(Some(32_768), Some(2_466_170));
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(
            warnings[0].starts_with("kernel.pid_max is 32768"),
            "{warnings:?}"
        );
        assert!(warnings[0].contains("8192000 tasks"), "{warnings:?}");
        assert!(
            warnings[1].contains("about 42949672 open files"),
            "{warnings:?}"
        );
        // What systemd sets, or what could not be read: nothing to say.
        let quiet = args.host_table_warnings(Some(PID_MAX_SYSTEMD), Some(FILE_MAX_SYSTEMD));
        assert!(quiet.is_empty(), "{quiet:?}");
        assert!(args.host_table_warnings(None, None).is_empty());
        // A pid_max no configuration of sessions can reach.
        let few = parse(&["--max-sessions", "2", "--max-session-pids", "300"]).unwrap();
        assert!(few.host_table_warnings(Some(32_768), None).is_empty());
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
        args.validate().unwrap();
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
        args.validate().unwrap();
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
    fn byte_sizes_in_json() {
        let parse = |text: &str| serde_json::from_str::<ByteSize>(text).map(|s| s.0);
        assert_eq!(parse("1024").unwrap(), 1024);
        assert_eq!(parse("\"512M\"").unwrap(), 512 << 20);
        for bad in ["-1", "\"12Q\"", "1.5", "null", "[]"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn no_auth_only_on_loopback() {
        parse(&["--no-auth"]).unwrap().validate().unwrap();
        parse(&["--no-auth", "--listen", "[::1]:80"])
            .unwrap()
            .validate()
            .unwrap();
        let err = parse(&["--no-auth", "--listen", "0.0.0.0:7700"])
            .unwrap()
            .validate()
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--no-auth") && err.contains("loopback"),
            "{err}"
        );
        assert!(!err.contains('\n'));
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
            assert!(
                parse(bad).unwrap().validate().is_err(),
                "{bad:?} should be refused"
            );
        }
        parse(&["--max-session-memory", "512M", "--max-session-pids", "256"])
            .unwrap()
            .validate()
            .unwrap();
    }
}
