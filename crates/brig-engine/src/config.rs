//! The daemon's settings, as the engine takes them: plain values, whoever parsed
//! them (`brig serve`'s flags are parsed by the server crate and converted).
//!
//! Sizes are in bytes (`*_bytes`) and durations in milliseconds (`*_ms`). Global
//! caps are `usize` (they are compared with in-memory counts); per-tenant defaults
//! are `u64` like the quotas they seed. [`Config::validate`] checks the rules that
//! span several settings; its messages name the `brig serve` flags, which are how
//! operators know the settings.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::bail;
use brig_jail::ids::IdRange;

/// The daemon's settings; each field is the `brig serve` flag of the same name
/// (in the flag's units where its name says `_bytes` or `_ms`). [`Default`] gives
/// the flags' defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    pub store: PathBuf,
    /// Requests without a key are tenant `default`; loopback addresses only.
    pub no_auth: bool,
    /// The image of `/v1/execute`.
    pub default_image: String,
    /// Build the default image in the background when it is missing from the store
    /// (see [`crate::default_image`]).
    pub build_default_image: bool,
    /// The recipe it is built from; `None`: for `python`, the one compiled in.
    pub default_image_recipe: Option<PathBuf>,
    /// The image of sessions that name none; `None`: the host's read-only system dirs.
    pub default_session_image: Option<String>,
    /// Captured output per stream and exec.
    pub output_limit_bytes: u64,
    /// Largest JSON request body.
    pub max_body_bytes: u64,
    /// Largest uploaded file (`/v1/files`, and files written into a session).
    pub max_file_size_bytes: u64,
    pub file_ttl_ms: u64,
    pub max_execute_timeout_ms: u64,
    pub max_sessions: usize,
    pub max_concurrent_execs: usize,
    pub max_processes: usize,
    pub max_snapshots: u64,
    pub max_connections: usize,
    pub header_timeout_ms: u64,
    pub body_timeout_ms: u64,
    pub max_session_memory_bytes: u64,
    pub max_session_pids: u64,
    /// `None`: the host's CPUs.
    pub max_session_cpus_millis: Option<u32>,
    pub volume_idle_unmount_ms: u64,
    pub tenant_max_sessions: u64,
    pub tenant_max_concurrent_execs: u64,
    pub tenant_max_processes: u64,
    pub tenant_max_snapshots: u64,
    pub tenant_max_disk_bytes: u64,
    pub session_ttl_ms: u64,
    pub session_idle_timeout_ms: u64,
    /// 0 keeps audit events forever.
    pub audit_retention_ms: u64,
    /// Ready sandboxes to keep, per image (`host`: the host's system dirs).
    pub pool: Vec<(String, usize)>,
    /// Host uid/gid range for sandboxes when running as root.
    pub id_range: Option<IdRange>,
    /// The kind of sandbox sessions run in.
    pub backend: crate::backend::BackendKind,
    /// The proxy resolves names from this hosts file only.
    pub egress_hosts: Option<PathBuf>,
    /// Roots (PEM) trusted for the upstreams of TLS intercepted for secrets,
    /// besides the web's.
    pub egress_ca_file: Option<PathBuf>,
    /// Forbidden ranges sessions may reach (an internal mirror).
    pub egress_allow_private: Vec<brig_policy::net::Cidr>,
    /// The network of sessions that do not ask for one.
    pub session_network: crate::egress::Network,
    /// Each session's proxy's bytes per second each way; `None`: no cap.
    pub egress_rate: Option<u64>,
    /// The image of an MCP session's sandbox; `None`: as a session that names none.
    pub mcp_image: Option<String>,
    /// The network of an MCP session's sandbox; `None`: `session_network`.
    pub mcp_network: Option<crate::egress::Network>,
    /// An MCP session unused this long ends, and its sandbox with it.
    pub mcp_idle_timeout_ms: u64,
}

/// The defaults of `brig serve` (the server's flags hold the same; a test there
/// keeps the two alike).
impl Default for Config {
    fn default() -> Config {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 7700)),
            data_dir: PathBuf::from("/var/lib/brig-server"),
            store: PathBuf::from("/var/lib/brig"),
            no_auth: false,
            default_image: "python".to_string(),
            build_default_image: true,
            default_image_recipe: None,
            default_session_image: None,
            output_limit_bytes: 1 << 20,
            max_body_bytes: 10 << 20,
            max_file_size_bytes: 100 << 20,
            file_ttl_ms: 24 * 3600 * 1000,
            max_execute_timeout_ms: 60_000,
            max_sessions: 2000,
            max_concurrent_execs: 256,
            max_processes: 2048,
            max_snapshots: 4,
            max_connections: 4096,
            header_timeout_ms: 30_000,
            body_timeout_ms: 60_000,
            max_session_memory_bytes: 16 << 30,
            max_session_pids: 4096,
            max_session_cpus_millis: None,
            volume_idle_unmount_ms: 5 * 60_000,
            tenant_max_sessions: 100,
            tenant_max_concurrent_execs: 16,
            tenant_max_processes: 256,
            tenant_max_snapshots: 2,
            tenant_max_disk_bytes: 10 << 30,
            session_ttl_ms: 3_600_000,
            session_idle_timeout_ms: 15 * 60_000,
            audit_retention_ms: 30 * 24 * 3600 * 1000,
            pool: Vec::new(),
            id_range: None,
            backend: crate::backend::BackendKind::Namespaces,
            egress_hosts: None,
            egress_ca_file: None,
            egress_allow_private: Vec::new(),
            session_network: crate::egress::Network::default(),
            egress_rate: None,
            mcp_image: None,
            mcp_network: None,
            mcp_idle_timeout_ms: 15 * 60_000,
        }
    }
}

impl Config {
    /// Checks the rules that involve several settings, or that a parser of single
    /// values cannot express.
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

    #[test]
    fn host_tables_smaller_than_what_sessions_may_take_are_warned_about() {
        let config = Config::default();
        // This CI machine's values, without systemd.
        let warnings = config.host_table_warnings(Some(32_768), Some(2_466_170));
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
        let quiet = config.host_table_warnings(Some(PID_MAX_SYSTEMD), Some(FILE_MAX_SYSTEMD));
        assert!(quiet.is_empty(), "{quiet:?}");
        assert!(config.host_table_warnings(None, None).is_empty());
        // A pid_max no configuration of sessions can reach.
        let few = Config {
            max_sessions: 2,
            max_session_pids: 300,
            ..Config::default()
        };
        assert!(few.host_table_warnings(Some(32_768), None).is_empty());
    }

    #[test]
    fn defaults_are_valid() {
        Config::default().validate().unwrap();
    }

    #[test]
    fn no_auth_only_on_loopback() {
        let no_auth = |listen: &str| Config {
            no_auth: true,
            listen: listen.parse().unwrap(),
            ..Config::default()
        };
        no_auth("127.0.0.1:7700").validate().unwrap();
        no_auth("[::1]:80").validate().unwrap();
        let err = no_auth("0.0.0.0:7700").validate().unwrap_err().to_string();
        assert!(
            err.contains("--no-auth") && err.contains("loopback"),
            "{err}"
        );
        assert!(!err.contains('\n'));
    }

    #[test]
    fn cross_setting_rules() {
        let base = Config::default;
        let pool = |pools: &[(&str, usize)]| {
            pools
                .iter()
                .map(|(image, n)| (image.to_string(), *n))
                .collect::<Vec<_>>()
        };
        for bad in [
            Config {
                max_sessions: 0,
                ..base()
            },
            Config {
                file_ttl_ms: 0,
                ..base()
            },
            Config {
                max_body_bytes: 0,
                ..base()
            },
            Config {
                pool: pool(&[("python", 3), ("python", 1)]),
                ..base()
            },
            Config {
                pool: pool(&[("python", 3)]),
                max_sessions: 2,
                ..base()
            },
            Config {
                default_image: " ".to_string(),
                ..base()
            },
            Config {
                max_processes: 0,
                ..base()
            },
            Config {
                volume_idle_unmount_ms: 0,
                ..base()
            },
            // Caps below what a session that asks for nothing gets.
            Config {
                max_session_memory_bytes: 256 << 20,
                ..base()
            },
            Config {
                max_session_pids: 100,
                ..base()
            },
            Config {
                max_session_cpus_millis: Some(500),
                ..base()
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?} should be refused");
        }
        Config {
            max_session_memory_bytes: 512 << 20,
            max_session_pids: 256,
            ..base()
        }
        .validate()
        .unwrap();
    }
}
