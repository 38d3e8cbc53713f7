//! What a brig sandbox is.
//!
//! This crate is pure data: the description of one sandbox (its command, identity,
//! filesystem, limits and security policies), the defaults that suit untrusted
//! AI-written code, and validation. It makes no system calls; `brig-jail` turns a
//! validated [`SandboxSpec`] into kernel state.

pub mod net;
mod units;

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use units::{parse_cpus_millis, parse_duration_ms, parse_size};

/// Default limits, documented in the README. They are meant for untrusted code
/// written by an AI agent: enough for real work in Python, small enough that a
/// runaway program cannot hurt the host.
pub mod defaults {
    pub const TIMEOUT_MS: u64 = 60_000;
    pub const MEMORY_BYTES: u64 = 512 << 20;
    pub const PIDS: u64 = 256;
    pub const CPUS_MILLIS: u32 = 1_000;
    pub const DISK_BYTES: u64 = 512 << 20;
    pub const OUTPUT_LIMIT_BYTES: u64 = 1 << 20;
    pub const NOFILE: u64 = 1_024;
    pub const UID: u32 = 1_000;
    pub const GID: u32 = 1_000;
    pub const HOSTNAME: &str = "sandbox";
    pub const USER_NAME: &str = "sandbox";
    pub const WORKSPACE: &str = "/workspace";
    pub const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
    pub const LANG: &str = "C.UTF-8";
}

/// Paths inside the sandbox that brig builds itself and that a bind may not replace.
pub const RESERVED_TARGETS: &[&str] = &["/proc", "/dev", "/sys"];

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PolicyError {
    #[error("invalid size '{0}': use a number with an optional unit K, M, G or T (e.g. 512M)")]
    BadSize(String),
    #[error("invalid duration '{0}': use a number with a unit ms, s, m or h (e.g. 30s)")]
    BadDuration(String),
    #[error("invalid CPU count '{0}': use a positive number such as 1 or 0.5")]
    BadCpus(String),
    #[error("invalid bind '{0}': use SRC:DST[:ro|rw] with absolute paths")]
    BadBind(String),
    #[error("invalid user '{0}': use UID or UID:GID (numbers)")]
    BadUser(String),
    #[error("invalid environment entry '{0}': use KEY=VALUE")]
    BadEnv(String),
    #[error("no command given: put it after --")]
    EmptyCommand,
    #[error("command and arguments may not contain NUL bytes")]
    NulInCommand,
    #[error("path '{0}' inside the sandbox must be absolute and may not contain '..'")]
    BadSandboxPath(String),
    #[error("host path '{0}' must be absolute")]
    RelativeHostPath(String),
    #[error("bind target '{0}' is managed by brig and cannot be replaced")]
    ReservedTarget(String),
    #[error("bind target '{0}' is used twice")]
    DuplicateTarget(String),
    #[error("invalid hostname '{0}': 1-64 characters of letters, digits, '-' and '.'")]
    BadHostname(String),
    #[error("id {0} cannot be used inside the sandbox")]
    BadId(u32),
    #[error("limit {name} is too small: {value} (minimum {minimum})")]
    LimitTooSmall {
        name: &'static str,
        value: u64,
        minimum: u64,
    },
    #[error("a root needs 1 to {MAX_LAYERS} layers, not {0}")]
    BadLayers(usize),
    #[error("capturing writes needs an image root (layers), or the host's system dirs with a private /workspace")]
    CaptureNeedsPrivateWrites,
    #[error("a seed fills the private /tmp and /workspace of a sandbox on the host's system dirs: it needs that root and no --workspace directory")]
    SeedNeedsScratch,
    #[error("the build id mapping covers ids 0-65535 only, not {0}")]
    BuildIdOutOfRange(u32),
    #[error("network mode '{0}' is not supported yet: the only mode is 'none' (loopback only)")]
    UnsupportedNetwork(String),
    #[error("extra CA: expected PEM certificates, at most 64 KiB")]
    BadExtraCa,
    #[error("workspace link '{0}': an absolute path outside the directories brig and the host provide (e.g. /home/user)")]
    BadWorkspaceLink(String),
    #[error("invalid user name '{0}': 1-32 of a-z 0-9 _ -, starting with a letter or _")]
    BadUserName(String),
}

/// A complete description of one sandbox run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxSpec {
    /// argv of the command; `command[0]` is looked up in the sandbox's PATH.
    pub command: Vec<String>,
    /// Extra environment on top of the sandbox defaults (PATH, HOME, LANG).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Working directory inside the sandbox.
    #[serde(default = "default_cwd")]
    pub cwd: String,
    #[serde(default)]
    pub identity: Identity,
    #[serde(default)]
    pub filesystem: Filesystem,
    #[serde(default)]
    pub limits: Limits,
    #[serde(default)]
    pub network: NetworkMode,
    #[serde(default)]
    pub seccomp: SeccompPolicy,
    #[serde(default)]
    pub landlock: LandlockMode,
}

fn default_cwd() -> String {
    defaults::WORKSPACE.to_string()
}

impl SandboxSpec {
    /// A spec with every default and the given command.
    pub fn new(command: Vec<String>) -> Self {
        SandboxSpec {
            command,
            env: BTreeMap::new(),
            cwd: default_cwd(),
            identity: Identity::default(),
            filesystem: Filesystem::default(),
            limits: Limits::default(),
            network: NetworkMode::default(),
            seccomp: SeccompPolicy::default(),
            landlock: LandlockMode::default(),
        }
    }

    /// The environment the command starts with: a cleared environment with a sane
    /// PATH, HOME and LANG, then the spec's own entries (which win).
    pub fn effective_env(&self) -> BTreeMap<String, String> {
        let mut env = BTreeMap::new();
        env.insert("PATH".to_string(), defaults::PATH.to_string());
        env.insert("HOME".to_string(), defaults::WORKSPACE.to_string());
        env.insert("LANG".to_string(), defaults::LANG.to_string());
        env.insert("HOSTNAME".to_string(), self.identity.hostname.clone());
        for (key, value) in &self.env {
            env.insert(key.clone(), value.clone());
        }
        env
    }

    /// Checks everything that can be checked without touching the system.
    pub fn validate(&self) -> Result<(), PolicyError> {
        if self.command.is_empty() || self.command[0].is_empty() {
            return Err(PolicyError::EmptyCommand);
        }
        if self.command.iter().any(|arg| arg.contains('\0')) {
            return Err(PolicyError::NulInCommand);
        }
        for (key, value) in &self.env {
            if key.is_empty() || key.contains('=') || key.contains('\0') || value.contains('\0') {
                return Err(PolicyError::BadEnv(format!("{key}={value}")));
            }
        }
        normalize_sandbox_path(&self.cwd)?;
        self.identity.validate()?;
        self.filesystem.validate()?;
        self.limits.validate()?;
        Ok(())
    }
}

/// Who the command runs as inside the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Identity {
    /// uid inside the sandbox. 0 is root of the sandbox's user namespace: it holds no
    /// capability and no host privilege.
    pub uid: u32,
    pub gid: u32,
    pub hostname: String,
    pub mapping: IdMapping,
    /// The sandbox user's name (and its group's) in the /etc/passwd and /etc/group
    /// brig writes; `None`: `sandbox`. E2B's SDKs expect `user`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl Default for Identity {
    fn default() -> Self {
        Identity {
            uid: defaults::UID,
            gid: defaults::GID,
            hostname: defaults::HOSTNAME.to_string(),
            mapping: IdMapping::default(),
            name: None,
        }
    }
}

/// How ids inside the sandbox map to host ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum IdMapping {
    /// The sandbox user is the only mapped id: one unprivileged host id leased per
    /// sandbox (or the caller's own id when brig runs unprivileged).
    #[default]
    Single,
    /// Ids 0-65535 inside are the same ids on the host, so files written keep real
    /// ownership (dpkg chowns to system users). For trusted image builds only: root
    /// inside is host uid 0 for permission checks on whatever the sandbox can see
    /// (only its own image tree), though still without host capabilities. The
    /// command keeps Docker's default capability set inside its user namespace.
    Build,
}

impl Identity {
    /// Parses `UID` or `UID:GID`; a lone UID also becomes the GID.
    pub fn parse_user(text: &str) -> Result<(u32, u32), PolicyError> {
        let bad = || PolicyError::BadUser(text.to_string());
        let (uid, gid) = match text.split_once(':') {
            Some((uid, gid)) => (uid, gid),
            None => (text, text),
        };
        let uid: u32 = uid.parse().map_err(|_| bad())?;
        let gid: u32 = gid.parse().map_err(|_| bad())?;
        Ok((uid, gid))
    }

    /// The sandbox user's name.
    pub fn user_name(&self) -> &str {
        self.name.as_deref().unwrap_or(defaults::USER_NAME)
    }

    fn validate(&self) -> Result<(), PolicyError> {
        if let Some(name) = &self.name {
            // What useradd takes: no separators, nothing a passwd line could split on.
            let valid = (1..=32).contains(&name.len())
                && name.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
                && name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_-".contains(&b));
            if !valid {
                return Err(PolicyError::BadUserName(name.clone()));
            }
        }
        // (uid_t)-1 means "unchanged" to set*id(2) and cannot be mapped.
        for id in [self.uid, self.gid] {
            if id == u32::MAX {
                return Err(PolicyError::BadId(id));
            }
            if self.mapping == IdMapping::Build && id >= 65_536 {
                return Err(PolicyError::BuildIdOutOfRange(id));
            }
        }
        let name = &self.hostname;
        let valid = !name.is_empty()
            && name.len() <= 64
            && !name.starts_with('-')
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.');
        if !valid {
            return Err(PolicyError::BadHostname(name.clone()));
        }
        Ok(())
    }
}

/// Where the sandbox's root filesystem comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum RootSource {
    /// The host's system directories (/usr, /bin, /lib*, /sbin), read-only.
    #[default]
    HostSystem,
    /// A directory tree on the host used as `/`, read-only.
    Directory(PathBuf),
    /// Read-only image layers stacked with overlayfs, bottom first: the host
    /// directories where each layer is mounted. The sandbox may write anywhere its
    /// user may; writes land in a private upper layer on the `--disk` tmpfs.
    Layers(Vec<PathBuf>),
}

/// Most layers one root may stack (overlayfs allows 500).
pub const MAX_LAYERS: usize = 500;

/// A host path made visible inside the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BindMount {
    pub source: PathBuf,
    /// Absolute, normalized path inside the sandbox.
    pub target: String,
    #[serde(default)]
    pub writable: bool,
    /// Files the host's root owns appear as the sandbox user's, and the sandbox
    /// user's writes land on the host as root's: an idmapped mount, as image layers
    /// are. For directories brig keeps for sandboxes (a session's volume); needs brig
    /// to run as root.
    #[serde(default)]
    pub idmapped: bool,
    /// `source` is a canonical path that was checked earlier (a recipe's copy
    /// source, checked to lie inside the recipe's directory): it is resolved
    /// without following any symlink, so one swapped in on the way since the check
    /// makes the sandbox fail to start instead of binding whatever it points at.
    #[serde(default)]
    pub no_symlinks: bool,
}

impl BindMount {
    /// Parses `SRC:DST[:ro|rw]`; read-only unless `rw` is given.
    pub fn parse(text: &str) -> Result<Self, PolicyError> {
        let bad = || PolicyError::BadBind(text.to_string());
        let mut parts = text.split(':');
        let source = parts.next().filter(|s| !s.is_empty()).ok_or_else(bad)?;
        let target = parts.next().filter(|s| !s.is_empty()).ok_or_else(bad)?;
        let writable = match parts.next() {
            None | Some("ro") => false,
            Some("rw") => true,
            Some(_) => return Err(bad()),
        };
        if parts.next().is_some() || !source.starts_with('/') || !target.starts_with('/') {
            return Err(bad());
        }
        Ok(BindMount {
            source: PathBuf::from(source),
            target: normalize_sandbox_path(target)?,
            writable,
            idmapped: false,
            no_symlinks: false,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Filesystem {
    pub root: RootSource,
    pub binds: Vec<BindMount>,
    /// A host directory bound read-write at /workspace instead of a private tmpfs.
    pub workspace: Option<PathBuf>,
    /// Keep what the sandbox writes reachable, for snapshots: an image root's
    /// overlay upper layer (handed back when a run ends, or by a session's agent),
    /// or, on the host's system dirs, the private /tmp and /workspace (a session's
    /// agent hands them out; a run hands nothing back). Not with a `--rootfs`
    /// directory or a host /workspace, whose writes are not the sandbox's own.
    pub capture_writes: bool,
    /// A snapshot of another sandbox's private directories (a layer mount whose
    /// `tmp/` and `workspace/` hold them): copied into this sandbox's /tmp and
    /// /workspace before it starts, as its user. Only with the host's system dirs as
    /// root and a private /workspace, the only roots whose writable state is those
    /// two directories.
    pub seed: Option<PathBuf>,
    /// PEM certificates the sandbox trusts besides its root's own (brig's egress
    /// CA, when it intercepts TLS for secrets): the root's bundle with these
    /// appended is placed at [`net::CA_BUNDLE`] and over the root's standard bundle.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub extra_ca: Option<String>,
    /// Other paths /workspace is reached at, as symlinks to it (E2B's /home/user),
    /// made on the host's system dirs, whose root is read-only: an image's root is
    /// the sandbox's own to make them in.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub workspace_links: Vec<String>,
}

/// Top-level names a workspace link may not be under: what brig makes in a root
/// on the host's system dirs, and what it binds there from the host.
const NOT_LINKABLE: &[&str] = &[
    "bin",
    "dev",
    "etc",
    "lib",
    "lib32",
    "lib64",
    "libx32",
    "proc",
    "sbin",
    "sys",
    "tmp",
    "usr",
    "var",
    "volume",
    "workspace",
];

impl Filesystem {
    fn validate(&self) -> Result<(), PolicyError> {
        for link in &self.workspace_links {
            let bad = || PolicyError::BadWorkspaceLink(link.clone());
            let path = normalize_sandbox_path(link).map_err(|_| bad())?;
            let top = path.trim_start_matches('/').split('/').next().unwrap_or("");
            if top.is_empty() || NOT_LINKABLE.contains(&top) || path != *link {
                return Err(bad());
            }
        }
        if let Some(pem) = &self.extra_ca {
            if pem.len() > 64 << 10 || !pem.contains("-----BEGIN CERTIFICATE-----") {
                return Err(PolicyError::BadExtraCa);
            }
        }
        match &self.root {
            RootSource::HostSystem => {}
            RootSource::Directory(dir) => require_absolute(dir)?,
            RootSource::Layers(layers) => {
                if layers.is_empty() || layers.len() > MAX_LAYERS {
                    return Err(PolicyError::BadLayers(layers.len()));
                }
                for layer in layers {
                    require_absolute(layer)?;
                }
            }
        }
        let private_writes = match self.root {
            RootSource::Layers(_) => true,
            RootSource::HostSystem => self.workspace.is_none(),
            RootSource::Directory(_) => false,
        };
        if self.capture_writes && !private_writes {
            return Err(PolicyError::CaptureNeedsPrivateWrites);
        }
        if let Some(seed) = &self.seed {
            if !matches!(self.root, RootSource::HostSystem) || self.workspace.is_some() {
                return Err(PolicyError::SeedNeedsScratch);
            }
            require_absolute(seed)?;
        }
        if let Some(dir) = &self.workspace {
            require_absolute(dir)?;
        }
        let mut seen = std::collections::BTreeSet::new();
        for bind in &self.binds {
            require_absolute(&bind.source)?;
            let target = normalize_sandbox_path(&bind.target)?;
            let reserved = target == "/"
                || target == "/tmp"
                || target == defaults::WORKSPACE
                || RESERVED_TARGETS
                    .iter()
                    .any(|r| target == *r || target.starts_with(&format!("{r}/")));
            if reserved {
                return Err(PolicyError::ReservedTarget(target));
            }
            if !seen.insert(target.clone()) {
                return Err(PolicyError::DuplicateTarget(target));
            }
        }
        Ok(())
    }
}

fn require_absolute(path: &std::path::Path) -> Result<(), PolicyError> {
    if path.is_absolute() {
        Ok(())
    } else {
        Err(PolicyError::RelativeHostPath(path.display().to_string()))
    }
}

/// Returns `path` with empty and `.` components removed; rejects relative paths and `..`.
pub fn normalize_sandbox_path(path: &str) -> Result<String, PolicyError> {
    if !path.starts_with('/') || path.contains('\0') {
        return Err(PolicyError::BadSandboxPath(path.to_string()));
    }
    let mut parts = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => return Err(PolicyError::BadSandboxPath(path.to_string())),
            other => parts.push(other),
        }
    }
    Ok(format!("/{}", parts.join("/")))
}

/// Resource limits. `None` means no limit of that kind.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Wall-clock limit; the whole process tree is killed when it fires.
    pub timeout_ms: Option<u64>,
    /// CPU time per process (RLIMIT_CPU).
    pub cpu_time_secs: Option<u64>,
    /// Memory of the whole sandbox, tmpfs pages included; no swap.
    pub memory_bytes: Option<u64>,
    /// Number of tasks (processes and threads) in the sandbox.
    pub pids: Option<u64>,
    /// CPU bandwidth in thousandths of a CPU (1500 = 1.5 CPUs).
    pub cpus_millis: Option<u32>,
    /// Size of all writable tmpfs storage together (/tmp, /workspace, /dev/shm).
    pub disk_bytes: u64,
    /// Bytes kept of each captured output stream; the rest is discarded and marked truncated.
    pub output_limit_bytes: u64,
    /// Open file descriptors per process (RLIMIT_NOFILE).
    pub nofile: u64,
    /// Largest file a process may write (RLIMIT_FSIZE).
    pub file_size_bytes: Option<u64>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            timeout_ms: Some(defaults::TIMEOUT_MS),
            cpu_time_secs: None,
            memory_bytes: Some(defaults::MEMORY_BYTES),
            pids: Some(defaults::PIDS),
            cpus_millis: Some(defaults::CPUS_MILLIS),
            disk_bytes: defaults::DISK_BYTES,
            output_limit_bytes: defaults::OUTPUT_LIMIT_BYTES,
            nofile: defaults::NOFILE,
            file_size_bytes: None,
        }
    }
}

/// Record locks a sandbox may hold per byte of its memory limit: one per 4 KiB page.
/// A lock is ~200 bytes of kernel memory that no cgroup is charged for, so the budget
/// lets locks take ~5% more of the host than the limit says. No program comes near it:
/// SQLite holds a handful per database.
pub const FILE_LOCK_BYTES: u64 = 4096;
/// The least budget, for the smallest memory limits.
pub const MIN_FILE_LOCKS: u64 = 1024;

impl Limits {
    /// How many record locks the sandbox's processes may hold together before those
    /// that hold any are killed ([`FILE_LOCK_BYTES`]); `None` without a memory limit,
    /// which leaves the host's memory unbounded anyway.
    pub fn file_lock_budget(&self) -> Option<u64> {
        self.memory_bytes
            .map(|bytes| (bytes / FILE_LOCK_BYTES).max(MIN_FILE_LOCKS))
    }

    fn validate(&self) -> Result<(), PolicyError> {
        let check = |name: &'static str, value: Option<u64>, minimum: u64| match value {
            Some(value) if value < minimum => Err(PolicyError::LimitTooSmall {
                name,
                value,
                minimum,
            }),
            _ => Ok(()),
        };
        check("timeout_ms", self.timeout_ms, 1)?;
        check("cpu_time_secs", self.cpu_time_secs, 1)?;
        // Below a few MiB even the sandbox's init and a shell cannot start.
        check("memory_bytes", self.memory_bytes, 4 << 20)?;
        // init plus the command.
        check("pids", self.pids, 2)?;
        // cgroup cpu bandwidth cannot go below 1% of a CPU.
        check("cpus_millis", self.cpus_millis.map(u64::from), 10)?;
        check("disk_bytes", Some(self.disk_bytes), 1 << 20)?;
        // stdio, a few libraries and a pipe or two.
        check("nofile", Some(self.nofile), 16)?;
        check("file_size_bytes", self.file_size_bytes, 1)?;
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum NetworkMode {
    /// A private network namespace with only the loopback interface.
    #[default]
    None,
    /// The host's network namespace. Used by image builds to download packages;
    /// not offered by `brig run`.
    Host,
    /// A private network namespace with only the loopback interface, where brig
    /// serves an egress proxy and a DNS resolver (see [`net`] and `brig-net`):
    /// /etc/resolv.conf names [`EGRESS_DNS`].
    Egress,
}

/// Where brig's DNS resolver listens inside a sandbox with [`NetworkMode::Egress`].
pub const EGRESS_DNS: std::net::Ipv4Addr = std::net::Ipv4Addr::new(127, 0, 0, 53);

impl std::str::FromStr for NetworkMode {
    type Err = PolicyError;
    fn from_str(text: &str) -> Result<Self, PolicyError> {
        match text {
            "none" => Ok(NetworkMode::None),
            other => Err(PolicyError::UnsupportedNetwork(other.to_string())),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum SeccompMode {
    /// brig's built-in filter (Docker's default denials and more).
    #[default]
    Default,
    Off,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct SeccompPolicy {
    pub mode: SeccompMode,
    /// Allow ptrace and process_vm_* between the sandbox's own processes (debuggers, strace).
    pub allow_ptrace: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum LandlockMode {
    /// Refuse to run unless Landlock is fully enforced.
    Required,
    /// Enforce what the running kernel supports and report the rest.
    #[default]
    BestEffort,
    Off,
}

impl std::str::FromStr for LandlockMode {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "required" => Ok(LandlockMode::Required),
            "best-effort" => Ok(LandlockMode::BestEffort),
            "off" => Ok(LandlockMode::Off),
            other => Err(format!(
                "invalid landlock mode '{other}': use required, best-effort or off"
            )),
        }
    }
}

impl std::str::FromStr for SeccompMode {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "default" => Ok(SeccompMode::Default),
            "off" => Ok(SeccompMode::Off),
            other => Err(format!(
                "invalid seccomp mode '{other}': use default or off"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> SandboxSpec {
        SandboxSpec::new(vec!["true".into()])
    }

    #[test]
    fn defaults_are_valid_and_documented_values() {
        let spec = spec();
        spec.validate().unwrap();
        assert_eq!(spec.limits.memory_bytes, Some(512 << 20));
        assert_eq!(spec.limits.pids, Some(256));
        assert_eq!(spec.limits.timeout_ms, Some(60_000));
        assert_eq!(spec.limits.disk_bytes, 512 << 20);
        assert_eq!(spec.limits.output_limit_bytes, 1 << 20);
        assert_eq!(spec.identity.uid, 1000);
        assert_eq!(spec.cwd, "/workspace");
        assert_eq!(spec.network, NetworkMode::None);
        assert_eq!(spec.seccomp.mode, SeccompMode::Default);
        assert!(!spec.seccomp.allow_ptrace);
    }

    #[test]
    fn the_lock_budget_follows_the_memory_limit() {
        let mut limits = Limits::default();
        assert_eq!(limits.file_lock_budget(), Some(131_072));
        limits.memory_bytes = Some(64 << 20);
        assert_eq!(limits.file_lock_budget(), Some(16_384));
        limits.memory_bytes = Some(4 << 20);
        assert_eq!(limits.file_lock_budget(), Some(MIN_FILE_LOCKS));
        limits.memory_bytes = None;
        assert_eq!(limits.file_lock_budget(), None);
    }

    #[test]
    fn user_names_are_ones_a_passwd_line_holds() {
        let mut s = spec();
        assert_eq!(s.identity.user_name(), "sandbox");
        s.identity.name = Some("user".into());
        s.validate().unwrap();
        assert_eq!(s.identity.user_name(), "user");
        for bad in ["", "User", "a:b", "9lives", "x y", &"a".repeat(33)] {
            s.identity.name = Some(bad.to_string());
            assert_eq!(
                s.validate(),
                Err(PolicyError::BadUserName(bad.into())),
                "{bad}"
            );
        }
    }

    #[test]
    fn workspace_links_stay_out_of_the_roots_own_directories() {
        let mut s = spec();
        for good in ["/home/user", "/home", "/opt/work"] {
            s.filesystem.workspace_links = vec![good.into()];
            s.validate().unwrap();
        }
        for bad in [
            "/",
            "home/user",
            "/usr/x",
            "/tmp/a",
            "/workspace",
            "/home/../etc",
            "/home//user",
        ] {
            s.filesystem.workspace_links = vec![bad.into()];
            assert_eq!(
                s.validate(),
                Err(PolicyError::BadWorkspaceLink(bad.into())),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_seed_needs_the_host_root_and_a_private_workspace() {
        let mut s = spec();
        s.filesystem.seed = Some("/store/mnt/abc".into());
        s.validate().unwrap();
        s.filesystem.seed = Some("relative".into());
        assert!(matches!(
            s.validate(),
            Err(PolicyError::RelativeHostPath(_))
        ));
        s.filesystem.seed = Some("/store/mnt/abc".into());
        s.filesystem.workspace = Some("/home/me/project".into());
        assert_eq!(s.validate(), Err(PolicyError::SeedNeedsScratch));
        s.filesystem.workspace = None;
        s.filesystem.root = RootSource::Layers(vec!["/store/mnt/def".into()]);
        assert_eq!(s.validate(), Err(PolicyError::SeedNeedsScratch));
    }

    #[test]
    fn writes_are_captured_only_where_they_are_the_sandboxs_own() {
        let mut s = spec();
        s.filesystem.capture_writes = true;
        s.validate().unwrap();
        s.filesystem.root = RootSource::Layers(vec!["/store/mnt/def".into()]);
        s.validate().unwrap();
        s.filesystem.root = RootSource::Directory("/srv/rootfs".into());
        assert_eq!(s.validate(), Err(PolicyError::CaptureNeedsPrivateWrites));
        s.filesystem.root = RootSource::HostSystem;
        s.filesystem.workspace = Some("/home/me/project".into());
        assert_eq!(s.validate(), Err(PolicyError::CaptureNeedsPrivateWrites));
    }

    #[test]
    fn empty_or_nul_command_rejected() {
        let mut s = spec();
        s.command.clear();
        assert_eq!(s.validate(), Err(PolicyError::EmptyCommand));
        s.command = vec!["".into()];
        assert_eq!(s.validate(), Err(PolicyError::EmptyCommand));
        s.command = vec!["a\0b".into()];
        assert_eq!(s.validate(), Err(PolicyError::NulInCommand));
    }

    #[test]
    fn env_is_cleared_except_defaults_and_overridable() {
        let mut s = spec();
        s.env.insert("PATH".into(), "/bin".into());
        s.env.insert("X".into(), "1".into());
        let env = s.effective_env();
        assert_eq!(env["PATH"], "/bin");
        assert_eq!(env["X"], "1");
        assert_eq!(env["HOME"], "/workspace");
        assert_eq!(env["LANG"], "C.UTF-8");
        assert_eq!(env.len(), 5);
        for bad in ["", "A=B", "A\0"] {
            let mut s = spec();
            s.env.insert(bad.into(), "v".into());
            assert!(
                matches!(s.validate(), Err(PolicyError::BadEnv(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn bind_parsing() {
        let b = BindMount::parse("/data:/in").unwrap();
        assert_eq!((b.target.as_str(), b.writable), ("/in", false));
        let b = BindMount::parse("/data:/out//x/./:rw").unwrap();
        assert_eq!((b.target.as_str(), b.writable), ("/out/x", true));
        assert!(!BindMount::parse("/data:/in:ro").unwrap().writable);
        for bad in [
            "",
            "/a",
            "a:/b",
            "/a:b",
            "/a:/b:rx",
            "/a:/b:rw:x",
            ":/b",
            "/a:",
            "/a:/../etc",
        ] {
            assert!(BindMount::parse(bad).is_err(), "{bad} should be rejected");
        }
    }

    #[test]
    fn reserved_and_duplicate_targets_rejected() {
        for target in [
            "/",
            "/proc",
            "/proc/sys",
            "/dev",
            "/dev/shm",
            "/sys/x",
            "/tmp",
            "/workspace",
        ] {
            let mut s = spec();
            s.filesystem.binds.push(BindMount {
                source: "/data".into(),
                target: target.into(),
                writable: false,
                idmapped: false,
                no_symlinks: false,
            });
            assert!(
                matches!(s.validate(), Err(PolicyError::ReservedTarget(_))),
                "{target}"
            );
        }
        let mut s = spec();
        for _ in 0..2 {
            s.filesystem
                .binds
                .push(BindMount::parse("/data:/in").unwrap());
        }
        assert_eq!(
            s.validate(),
            Err(PolicyError::DuplicateTarget("/in".into()))
        );
        // Below /tmp and /workspace is fine: the mount point is made in the writable tmpfs.
        let mut s = spec();
        s.filesystem
            .binds
            .push(BindMount::parse("/data:/workspace/data").unwrap());
        s.filesystem
            .binds
            .push(BindMount::parse("/data:/tmp/data").unwrap());
        s.validate().unwrap();
    }

    #[test]
    fn relative_host_paths_rejected() {
        let mut s = spec();
        s.filesystem.root = RootSource::Directory("rootfs".into());
        assert!(matches!(
            s.validate(),
            Err(PolicyError::RelativeHostPath(_))
        ));
        let mut s = spec();
        s.filesystem.workspace = Some("ws".into());
        assert!(matches!(
            s.validate(),
            Err(PolicyError::RelativeHostPath(_))
        ));
    }

    #[test]
    fn sandbox_paths() {
        assert_eq!(normalize_sandbox_path("/").unwrap(), "/");
        assert_eq!(normalize_sandbox_path("/a//b/./c/").unwrap(), "/a/b/c");
        for bad in ["", "a", "/a/../b", "/.."] {
            assert!(normalize_sandbox_path(bad).is_err(), "{bad}");
        }
        let mut s = spec();
        s.cwd = "relative".into();
        assert!(s.validate().is_err());
    }

    #[test]
    fn users_and_hostnames() {
        assert_eq!(Identity::parse_user("0").unwrap(), (0, 0));
        assert_eq!(Identity::parse_user("1000:100").unwrap(), (1000, 100));
        for bad in ["", "x", "1:", ":1", "1:2:3", "-1"] {
            assert!(Identity::parse_user(bad).is_err(), "{bad}");
        }
        let mut s = spec();
        s.identity.uid = u32::MAX;
        assert_eq!(s.validate(), Err(PolicyError::BadId(u32::MAX)));
        for bad in ["", "-x", "a b", &"x".repeat(65), "a/b"] {
            let mut s = spec();
            s.identity.hostname = bad.to_string();
            assert!(
                matches!(s.validate(), Err(PolicyError::BadHostname(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn limits_have_floors() {
        let mut s = spec();
        s.limits.memory_bytes = Some(1 << 20);
        assert!(matches!(
            s.validate(),
            Err(PolicyError::LimitTooSmall {
                name: "memory_bytes",
                ..
            })
        ));
        let mut s = spec();
        s.limits.pids = Some(1);
        assert!(s.validate().is_err());
        let mut s = spec();
        s.limits.timeout_ms = Some(0);
        assert!(s.validate().is_err());
        let mut s = spec();
        s.limits.nofile = 3;
        assert!(s.validate().is_err());
        let mut s = spec();
        s.limits.cpus_millis = Some(5);
        assert!(s.validate().is_err());
        let mut s = spec();
        s.limits = Limits {
            timeout_ms: None,
            cpu_time_secs: None,
            memory_bytes: None,
            pids: None,
            cpus_millis: None,
            file_size_bytes: None,
            ..Limits::default()
        };
        s.validate().unwrap();
    }

    #[test]
    fn spec_round_trips_and_rejects_unknown_fields() {
        let mut s = spec();
        s.filesystem
            .binds
            .push(BindMount::parse("/data:/in:rw").unwrap());
        s.filesystem.root = RootSource::Directory("/srv/root".into());
        let json = serde_json::to_string(&s).unwrap();
        let back: SandboxSpec = serde_json::from_str(&json).unwrap();
        assert_eq!(back, s);
        let minimal: SandboxSpec = serde_json::from_str(r#"{"command":["true"]}"#).unwrap();
        assert_eq!(minimal, spec());
        assert!(serde_json::from_str::<SandboxSpec>(r#"{"command":["true"],"bogus":1}"#).is_err());
        assert!(serde_json::from_str::<SandboxSpec>(
            r#"{"command":["true"],"limits":{"memory":1}}"#
        )
        .is_err());
    }

    #[test]
    fn mode_parsing() {
        assert_eq!("none".parse::<NetworkMode>().unwrap(), NetworkMode::None);
        assert!(matches!(
            "host".parse::<NetworkMode>(),
            Err(PolicyError::UnsupportedNetwork(_))
        ));
        assert_eq!(
            "required".parse::<LandlockMode>().unwrap(),
            LandlockMode::Required
        );
        assert_eq!(
            "best-effort".parse::<LandlockMode>().unwrap(),
            LandlockMode::BestEffort
        );
        assert_eq!("off".parse::<LandlockMode>().unwrap(), LandlockMode::Off);
        assert!("on".parse::<LandlockMode>().is_err());
        assert_eq!("off".parse::<SeccompMode>().unwrap(), SeccompMode::Off);
        assert!("strict".parse::<SeccompMode>().is_err());
    }
}
