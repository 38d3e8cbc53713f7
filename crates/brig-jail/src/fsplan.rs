//! The sandbox's filesystem as a list of steps.
//!
//! The plan is computed in the parent from the spec and a look at the host (which
//! system directories exist, which are symlinks, what a rootfs holds), before any
//! namespace exists. The child only executes it (`mounts.rs`). Keeping the plan as
//! data makes the layout unit-testable without root, and lets a daemon compute it once.
//!
//! Layout inside the sandbox:
//! - `/` is a small tmpfs made read-only at the end;
//! - system directories (or the rootfs's entries) are read-only, nosuid, nodev binds;
//! - `/etc` is synthesized: passwd/group/hosts/hostname/resolv.conf/nsswitch.conf
//!   written by brig, plus an allowlist of harmless host entries (certificates,
//!   ld.so.cache, alternatives, ...), never shadow, ssh keys or similar;
//! - `/proc` is a fresh procfs with Docker's masked and read-only paths;
//! - `/dev` is a read-only tmpfs with null, zero, full, random, urandom, tty, a private
//!   devpts and `/dev/shm`;
//! - `/tmp`, `/workspace` and `/dev/shm` are directories of one "scratch" tmpfs whose
//!   size is the `--disk` limit, so together they can never exceed it.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use brig_policy::{defaults, IdMapping, NetworkMode, RootSource, SandboxSpec};

use crate::JailError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeKind {
    Dir,
    File,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// read-only, nosuid, nodev
    ReadOnly,
    /// writable, nosuid, nodev
    ReadWrite,
    /// a device node: nosuid, noexec, devices allowed
    Device,
}

/// Subdirectories of the scratch tmpfs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScratchDir {
    Tmp,
    Workspace,
    Shm,
}

impl ScratchDir {
    pub const ALL: [ScratchDir; 3] = [ScratchDir::Tmp, ScratchDir::Workspace, ScratchDir::Shm];

    pub fn name(self) -> &'static str {
        match self {
            ScratchDir::Tmp => "tmp",
            ScratchDir::Workspace => "workspace",
            ScratchDir::Shm => "shm",
        }
    }

    /// Sticky world-writable like a normal /tmp, except the workspace, which
    /// belongs to the sandbox user.
    pub fn mode(self) -> u32 {
        match self {
            ScratchDir::Workspace => 0o755,
            _ => 0o1777,
        }
    }
}

/// One step of building the root. Paths are absolute paths inside the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FsOp {
    Dir {
        path: String,
        mode: u32,
    },
    Symlink {
        path: String,
        target: PathBuf,
    },
    File {
        path: String,
        contents: Vec<u8>,
        mode: u32,
    },
    /// A small world-readable host file copied in by the sandbox's side (in parallel
    /// with the parent's work) rather than bound: fewer mounts to make and tear down.
    Copy {
        source: PathBuf,
        path: String,
        mode: u32,
        /// The size the plan saw: the copy ends there without asking for more.
        size: u64,
        /// Which version of the file the plan saw.
        stamp: FileStamp,
    },
    /// A host path (resolved before the sandbox's mounts exist) attached at `path`.
    Bind {
        source: PathBuf,
        path: String,
        kind: NodeKind,
        access: Access,
        /// Host root's files appear as the sandbox user's (see `BindMount::idmapped`).
        idmapped: bool,
        /// `source` is resolved without following symlinks (see `BindMount::no_symlinks`).
        no_symlinks: bool,
    },
    /// A directory of the scratch tmpfs attached at `path`.
    Scratch {
        dir: ScratchDir,
        path: String,
    },
    Tmpfs {
        path: String,
        size_bytes: u64,
        mode: u32,
    },
    Proc {
        path: String,
    },
    Devpts {
        path: String,
    },
    /// Hide a /proc entry: /dev/null over a file, an empty read-only tmpfs over a directory.
    Mask {
        path: String,
    },
    /// Rebind a /proc entry read-only.
    ReadOnly {
        path: String,
    },
    /// Make the mount at `path` read-only (its submounts keep their own flags).
    Seal {
        path: String,
    },
    /// A file brig writes (hosts, resolv.conf, ...) bound over `path` from the scratch
    /// tmpfs: over an image's own file it hides it without writing into the image's
    /// upper layer, so snapshots never capture brig's files.
    Generated {
        path: String,
        contents: Vec<u8>,
    },
}

impl FsOp {
    /// Where in the sandbox this step acts.
    pub fn path(&self) -> &str {
        match self {
            FsOp::Dir { path, .. }
            | FsOp::Symlink { path, .. }
            | FsOp::File { path, .. }
            | FsOp::Copy { path, .. }
            | FsOp::Bind { path, .. }
            | FsOp::Scratch { path, .. }
            | FsOp::Tmpfs { path, .. }
            | FsOp::Proc { path }
            | FsOp::Devpts { path }
            | FsOp::Mask { path }
            | FsOp::ReadOnly { path }
            | FsOp::Seal { path }
            | FsOp::Generated { path, .. } => path,
        }
    }
}

/// What tells one version of a host file from another: writing to the file changes
/// its change time, replacing it changes its inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FileStamp {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub ctime_sec: i64,
    pub ctime_nsec: i64,
}

impl FileStamp {
    pub fn of(meta: &std::fs::Metadata) -> FileStamp {
        FileStamp {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            ctime_sec: meta.ctime(),
            ctime_nsec: meta.ctime_nsec(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsPlan {
    /// Image layers stacked as the root (bottom first); empty for a tmpfs root.
    pub layers: Vec<PathBuf>,
    pub ops: Vec<FsOp>,
    /// Size of the scratch tmpfs behind /tmp, /workspace and /dev/shm.
    pub scratch_bytes: u64,
    /// Paths the sandbox may write below (Landlock rules).
    pub writable: Vec<String>,
    /// Where the sandbox may read, write and ioctl device files (Landlock rules).
    pub devices: Vec<String>,
    /// A `--rootfs` directory: whoever owns it may swap its entries for symlinks
    /// between the plan and the mounts, so sources below it are opened with the
    /// sandbox user's rights only (see `mounts::open_sources`).
    pub untrusted_root: Option<PathBuf>,
    /// A snapshot's layer mount whose `tmp/` and `workspace/` fill the scratch
    /// directories of the same names (see `seed.rs`).
    pub seed: Option<PathBuf>,
}

/// Host system directories visible in host mode.
const SYSTEM_DIRS: &[&str] = &["usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"];

/// Host /etc entries exposed in host mode: what libc, TLS, Python and common tools
/// read, and nothing that names users, holds credentials or configures the host.
/// A trailing `*` matches a prefix.
const HOST_ETC_ALLOWLIST: &[&str] = &[
    "alternatives",
    "bash.bashrc",
    "ca-certificates",
    "ca-certificates.conf",
    "crypto-policies",
    "debian_version",
    "fonts",
    "gai.conf",
    "host.conf",
    "ImageMagick-*",
    "inputrc",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "locale.alias",
    "locale.conf",
    "localtime",
    "lsb-release",
    "magic",
    "magic.mime",
    "mailcap",
    "matplotlibrc",
    "mime.types",
    "networks",
    "os-release",
    "papersize",
    "perl",
    "pki/ca-trust",
    "pki/tls/certs",
    "profile",
    "protocols",
    "python3*",
    "services",
    "shells",
    "ssl/certs",
    "ssl/openssl.cnf",
    "terminfo",
    "timezone",
];

/// Never taken from a rootfs's /etc either: brig writes its own, or they are secrets.
const ETC_NEVER: &[&str] = &[
    "passwd",
    "group",
    "hosts",
    "hostname",
    "resolv.conf",
    "nsswitch.conf",
    "mtab",
    "shadow",
    "shadow-",
    "gshadow",
    "gshadow-",
    "passwd-",
    "group-",
    "sudoers",
    "sudoers.d",
    "ssh",
    "machine-id",
    "subuid",
    "subgid",
    "security",
];

/// Top-level names brig provides itself, skipped when taken from a rootfs.
const ROOT_MANAGED: &[&str] = &["proc", "dev", "sys", "tmp", "workspace", "etc"];

/// /proc entries hidden as in Docker's default MaskedPaths.
const PROC_MASKED: &[&str] = &[
    "acpi",
    "asound",
    "interrupts",
    "kcore",
    "keys",
    "latency_stats",
    "sched_debug",
    "scsi",
    "timer_list",
    "timer_stats",
];

/// /proc entries made read-only as in Docker's default ReadonlyPaths.
const PROC_READ_ONLY: &[&str] = &["bus", "fs", "irq", "sys", "sysrq-trigger"];

const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

/// Regular files up to this size that everybody may read are copied into the root
/// tmpfs instead of bound: fewer mounts to create and tear down. Past it, the copy
/// costs more than the mount (binding /etc's 34 KiB ld.so.cache and 72 KiB
/// mime.types rather than copying them took ~0.1 ms off a run; BENCHMARKS.md).
const COPY_LIMIT_BYTES: u64 = 16 << 10;

/// Builds the plan. `host_root` is `/` except in tests, which use a fake host tree.
pub fn plan(spec: &SandboxSpec, host_root: &Path) -> Result<FsPlan, JailError> {
    let mut ops = Vec::new();
    let host = |p: &str| host_root.join(p.trim_start_matches('/'));

    match &spec.filesystem.root {
        RootSource::HostSystem => {
            for name in SYSTEM_DIRS {
                add_entry(&mut ops, &host(name), &format!("/{name}"))?;
            }
        }
        RootSource::Directory(dir) => {
            let dir = host(&dir.to_string_lossy());
            let mut names = read_dir_names(&dir)?;
            names.retain(|n| !ROOT_MANAGED.contains(&n.as_str()));
            for name in names {
                add_entry(&mut ops, &dir.join(&name), &format!("/{name}"))?;
            }
        }
        RootSource::Layers(layers) => {
            for layer in layers {
                let layer = host(&layer.to_string_lossy());
                if !layer.is_dir() {
                    return Err(JailError::HostPath {
                        path: layer.display().to_string(),
                        reason: "image layer is not mounted there".into(),
                    });
                }
            }
        }
    }
    let layered = matches!(spec.filesystem.root, RootSource::Layers(_));

    plan_etc(spec, host_root, &mut ops)?;

    // /dev first: masking /proc binds /dev/null over files.
    ops.push(FsOp::Dir {
        path: "/dev".into(),
        mode: 0o755,
    });
    ops.push(FsOp::Tmpfs {
        path: "/dev".into(),
        size_bytes: 64 << 10,
        mode: 0o755,
    });
    for name in DEVICES {
        let source = host(&format!("/dev/{name}"));
        if source.exists() {
            ops.push(FsOp::Bind {
                source,
                path: format!("/dev/{name}"),
                kind: NodeKind::File,
                access: Access::Device,
                idmapped: false,
                no_symlinks: false,
            });
        }
    }
    ops.push(FsOp::Dir {
        path: "/dev/pts".into(),
        mode: 0o755,
    });
    ops.push(FsOp::Devpts {
        path: "/dev/pts".into(),
    });
    for (link, target) in [
        ("ptmx", "pts/ptmx"),
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        ops.push(FsOp::Symlink {
            path: format!("/dev/{link}"),
            target: target.into(),
        });
    }
    ops.push(FsOp::Dir {
        path: "/dev/shm".into(),
        mode: 0o755,
    });
    ops.push(FsOp::Scratch {
        dir: ScratchDir::Shm,
        path: "/dev/shm".into(),
    });
    ops.push(FsOp::Seal {
        path: "/dev".into(),
    });
    ops.push(FsOp::Dir {
        path: "/sys".into(),
        mode: 0o555,
    });

    ops.push(FsOp::Dir {
        path: "/proc".into(),
        mode: 0o555,
    });
    ops.push(FsOp::Proc {
        path: "/proc".into(),
    });
    for name in PROC_MASKED {
        ops.push(FsOp::Mask {
            path: format!("/proc/{name}"),
        });
    }
    for name in PROC_READ_ONLY {
        ops.push(FsOp::ReadOnly {
            path: format!("/proc/{name}"),
        });
    }

    // An image's root is the sandbox's own (its writes go to a private upper layer),
    // so Landlock allows writes anywhere the kernel's permission checks do.
    let mut writable = if layered {
        vec!["/".to_string()]
    } else {
        vec!["/tmp".to_string(), "/dev/shm".to_string()]
    };
    ops.push(FsOp::Dir {
        path: "/tmp".into(),
        mode: 0o755,
    });
    ops.push(FsOp::Scratch {
        dir: ScratchDir::Tmp,
        path: "/tmp".into(),
    });
    ops.push(FsOp::Dir {
        path: defaults::WORKSPACE.into(),
        mode: 0o755,
    });
    match &spec.filesystem.workspace {
        Some(dir) => ops.push(FsOp::Bind {
            source: host(&dir.to_string_lossy()),
            path: defaults::WORKSPACE.into(),
            kind: NodeKind::Dir,
            access: Access::ReadWrite,
            idmapped: false,
            no_symlinks: false,
        }),
        // In an image the workspace is a directory of the root itself, so snapshots
        // keep it.
        None if layered => {}
        None => ops.push(FsOp::Scratch {
            dir: ScratchDir::Workspace,
            path: defaults::WORKSPACE.into(),
        }),
    }
    if !layered {
        writable.push(defaults::WORKSPACE.into());
        ops.push(FsOp::Dir {
            path: "/var".into(),
            mode: 0o755,
        });
        ops.push(FsOp::Symlink {
            path: "/var/tmp".into(),
            target: "/tmp".into(),
        });
        let links = match spec.filesystem.root {
            RootSource::HostSystem => spec.filesystem.workspace_links.as_slice(),
            _ => &[],
        };
        for link in links {
            // The policy checked it: absolute, normalized, none of the root's own.
            let mut parent = String::new();
            let parts: Vec<&str> = link.trim_start_matches('/').split('/').collect();
            for part in &parts[..parts.len() - 1] {
                parent.push('/');
                parent.push_str(part);
                ops.push(FsOp::Dir {
                    path: parent.clone(),
                    mode: 0o755,
                });
            }
            ops.push(FsOp::Symlink {
                path: link.clone(),
                target: defaults::WORKSPACE.into(),
            });
        }
    }

    // Parents before children, so a bind below another bind lands on top of it.
    let mut binds: Vec<_> = spec.filesystem.binds.iter().collect();
    binds.sort_by_key(|b| b.target.matches('/').count());
    for bind in binds {
        let source = host(&bind.source.to_string_lossy());
        let meta = std::fs::metadata(&source).map_err(|e| JailError::HostPath {
            path: bind.source.display().to_string(),
            reason: e.to_string(),
        })?;
        let kind = if meta.is_dir() {
            NodeKind::Dir
        } else {
            NodeKind::File
        };
        ops.push(FsOp::Bind {
            source,
            path: bind.target.clone(),
            kind,
            access: if bind.writable {
                Access::ReadWrite
            } else {
                Access::ReadOnly
            },
            idmapped: bind.idmapped,
            no_symlinks: bind.no_symlinks,
        });
        if bind.writable {
            writable.push(bind.target.clone());
        }
    }

    Ok(FsPlan {
        layers: match &spec.filesystem.root {
            RootSource::Layers(layers) => {
                layers.iter().map(|l| host(&l.to_string_lossy())).collect()
            }
            _ => Vec::new(),
        },
        ops,
        scratch_bytes: spec.limits.disk_bytes,
        writable,
        // The /dev tmpfs as a whole, one Landlock rule instead of one per device
        // (~6 µs each): it holds only the device binds, pts and shm, and is sealed
        // read-only, so nothing else can appear below it.
        devices: vec!["/dev".into()],
        untrusted_root: match &spec.filesystem.root {
            RootSource::Directory(dir) => Some(host(&dir.to_string_lossy())),
            _ => None,
        },
        seed: spec
            .filesystem
            .seed
            .as_ref()
            .map(|seed| host(&seed.to_string_lossy())),
    })
}

impl FsPlan {
    /// Paths brig creates in the sandbox's root or mounts something over. In an
    /// image root, a missing one is created in the upper layer as an empty file or
    /// directory; snapshots leave those placeholders out.
    pub fn placeholders(&self) -> Vec<String> {
        self.ops
            .iter()
            .filter_map(|op| match op {
                FsOp::Dir { path, .. }
                | FsOp::Bind { path, .. }
                | FsOp::Scratch { path, .. }
                | FsOp::Tmpfs { path, .. }
                | FsOp::Proc { path }
                | FsOp::Devpts { path }
                | FsOp::Generated { path, .. } => Some(path.clone()),
                _ => None,
            })
            .collect()
    }
}

fn read_dir_names(dir: &Path) -> Result<Vec<String>, JailError> {
    read_dir_typed(dir)
        .map(|entries| entries.into_iter().map(|(name, _)| name).collect())
        .map_err(|e| JailError::HostPath {
            path: dir.display().to_string(),
            reason: e.to_string(),
        })
}

/// Host directory `source` bound read-only at `path`.
fn read_only_dir(source: &Path, path: &str) -> FsOp {
    FsOp::Bind {
        source: source.to_path_buf(),
        path: path.to_string(),
        kind: NodeKind::Dir,
        access: Access::ReadOnly,
        idmapped: false,
        no_symlinks: false,
    }
}

/// Names in `dir`, sorted, each with its type where the listing gives one (d_type).
fn read_dir_typed(dir: &Path) -> std::io::Result<Vec<(String, Option<std::fs::FileType>)>> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let kind = e.file_type().ok();
            e.file_name().into_string().ok().map(|name| (name, kind))
        })
        .collect();
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(entries)
}

/// Adds a host entry at `path`: a symlink is recreated, a directory bound read-only,
/// a small world-readable file copied, any other file bound read-only (so its
/// permissions still apply); sockets, fifos and devices are skipped.
fn add_entry(ops: &mut Vec<FsOp>, source: &Path, path: &str) -> Result<(), JailError> {
    let meta = match std::fs::symlink_metadata(source) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => {
            return Err(JailError::HostPath {
                path: source.display().to_string(),
                reason: e.to_string(),
            })
        }
    };
    let file_type = meta.file_type();
    if file_type.is_symlink() {
        let target = std::fs::read_link(source).map_err(|e| JailError::HostPath {
            path: source.display().to_string(),
            reason: e.to_string(),
        })?;
        ops.push(FsOp::Symlink {
            path: path.to_string(),
            target,
        });
    } else if file_type.is_dir() {
        ops.push(read_only_dir(source, path));
    } else if file_type.is_file() {
        let world_readable = meta.permissions().mode() & 0o004 != 0;
        if world_readable && meta.size() <= COPY_LIMIT_BYTES {
            ops.push(FsOp::Copy {
                source: source.to_path_buf(),
                path: path.to_string(),
                mode: meta.mode() & 0o755,
                size: meta.size(),
                stamp: FileStamp::of(&meta),
            })
        } else {
            ops.push(FsOp::Bind {
                source: source.to_path_buf(),
                path: path.to_string(),
                kind: NodeKind::File,
                access: Access::ReadOnly,
                idmapped: false,
                no_symlinks: false,
            })
        }
    }
    Ok(())
}

fn plan_etc(spec: &SandboxSpec, host_root: &Path, ops: &mut Vec<FsOp>) -> Result<(), JailError> {
    ops.push(FsOp::Dir {
        path: "/etc".into(),
        mode: 0o755,
    });
    let (etc_dir, base_passwd, base_group) = match &spec.filesystem.root {
        RootSource::HostSystem => {
            let etc = host_root.join("etc");
            let host_entries = read_dir_typed(&etc).unwrap_or_default();
            for pattern in HOST_ETC_ALLOWLIST {
                let matches: Vec<String> = match pattern.strip_suffix('*') {
                    Some(prefix) if !prefix.contains('/') => host_entries
                        .iter()
                        .filter(|(n, _)| n.starts_with(prefix))
                        .map(|(n, _)| n.clone())
                        .collect(),
                    _ => vec![pattern.to_string()],
                };
                for name in matches {
                    // The listing already says which top-level names exist: no stat
                    // for the many allowlisted entries a host does not have.
                    let top = name.split('/').next().unwrap_or_default();
                    let Ok(found) = host_entries.binary_search_by(|(n, _)| n.as_str().cmp(top))
                    else {
                        continue;
                    };
                    // Nor for a directory: the listing's type says it is bound.
                    if name == top && host_entries[found].1.is_some_and(|t| t.is_dir()) {
                        ops.push(read_only_dir(&etc.join(&name), &format!("/etc/{name}")));
                        continue;
                    }
                    if let Some((parent, _)) = name.rsplit_once('/') {
                        let mut path = String::from("/etc");
                        for part in parent.split('/') {
                            path.push('/');
                            path.push_str(part);
                            ops.push(FsOp::Dir {
                                path: path.clone(),
                                mode: 0o755,
                            });
                        }
                    }
                    add_entry(ops, &etc.join(&name), &format!("/etc/{name}"))?;
                }
            }
            (etc, None, None)
        }
        RootSource::Directory(dir) => {
            let etc = host_root
                .join(dir.to_string_lossy().trim_start_matches('/'))
                .join("etc");
            for name in read_dir_names(&etc).unwrap_or_default() {
                if !ETC_NEVER.contains(&name.as_str()) {
                    add_entry(ops, &etc.join(&name), &format!("/etc/{name}"))?;
                }
            }
            let passwd = std::fs::read_to_string(etc.join("passwd")).ok();
            let group = std::fs::read_to_string(etc.join("group")).ok();
            (etc, passwd, group)
        }
        RootSource::Layers(_) => return plan_image_etc(spec, host_root, ops),
    };
    let _ = etc_dir;
    let id = &spec.identity;
    let files = [
        (
            "passwd",
            passwd(id.uid, id.gid, id.user_name(), base_passwd.as_deref()),
        ),
        (
            "group",
            group(id.gid, id.user_name(), base_group.as_deref()),
        ),
        ("hosts", hosts(&id.hostname)),
        ("hostname", format!("{}\n", id.hostname)),
        ("resolv.conf", resolv_conf(spec, host_root)),
        (
            "nsswitch.conf",
            "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\nnetworks: files\n\
             protocols: files\nservices: files\nethers: files\nrpc: files\n"
                .to_string(),
        ),
    ];
    for (name, contents) in files {
        ops.push(FsOp::File {
            path: format!("/etc/{name}"),
            contents: contents.into_bytes(),
            mode: 0o644,
        });
    }
    ops.push(FsOp::Symlink {
        path: "/etc/mtab".into(),
        target: "/proc/self/mounts".into(),
    });
    plan_ca_bundle(spec, host_root, ops);
    Ok(())
}

/// Where roots keep their CA bundle (Debian and Alpine, Fedora, others), by preference.
const STANDARD_CA_BUNDLES: &[&str] = &[
    "etc/ssl/certs/ca-certificates.crt",
    "etc/pki/tls/certs/ca-bundle.crt",
    "etc/ssl/cert.pem",
];

/// With `extra_ca` (brig intercepts this sandbox's TLS): the root's bundle plus
/// those certificates, at [`brig_policy::net::CA_BUNDLE`] and over the root's own
/// bundle, so tools that ignore `SSL_CERT_FILE` trust brig's CA too. Generated
/// (bound from the scratch tmpfs): never written into a root or an image's layer.
fn plan_ca_bundle(spec: &SandboxSpec, host_root: &Path, ops: &mut Vec<FsOp>) {
    let Some(extra) = &spec.filesystem.extra_ca else {
        return;
    };
    // An image or rootfs is read without following its symlinks (read_layered):
    // one planted there must not lead brig to a host file.
    let read = |path: &str| -> Option<String> {
        match &spec.filesystem.root {
            RootSource::HostSystem => std::fs::read_to_string(host_root.join(path)).ok(),
            RootSource::Directory(dir) => read_layered(
                &[host_root.join(dir.to_string_lossy().trim_start_matches('/'))],
                path,
            ),
            RootSource::Layers(layers) => {
                let layers: Vec<PathBuf> = layers
                    .iter()
                    .map(|l| host_root.join(l.to_string_lossy().trim_start_matches('/')))
                    .collect();
                read_layered(&layers, path)
            }
        }
    };
    let found = STANDARD_CA_BUNDLES
        .iter()
        .find_map(|path| read(path).map(|text| (*path, text)));
    let mut bundle = found.as_ref().map(|(_, t)| t.clone()).unwrap_or_default();
    if !bundle.is_empty() && !bundle.ends_with('\n') {
        bundle.push('\n');
    }
    bundle.push_str("# brig egress CA: brig intercepts TLS to this sandbox's secrets' hosts\n");
    bundle.push_str(extra);
    let own = brig_policy::net::CA_BUNDLE;
    if let Some((parent, _)) = own.rsplit_once('/') {
        ops.push(FsOp::Dir {
            path: parent.to_string(),
            mode: 0o755,
        });
    }
    ops.push(FsOp::Generated {
        path: own.to_string(),
        contents: bundle.clone().into_bytes(),
    });
    if let Some((path, _)) = found {
        ops.push(FsOp::Generated {
            path: format!("/{path}"),
            contents: bundle.into_bytes(),
        });
    }
}

/// /etc/resolv.conf for the sandbox's network mode.
fn resolv_conf(spec: &SandboxSpec, host_root: &Path) -> String {
    match spec.network {
        NetworkMode::None => "# brig: --network none, the sandbox has loopback only\n".to_string(),
        NetworkMode::Host => {
            std::fs::read_to_string(host_root.join("etc/resolv.conf")).unwrap_or_default()
        }
        NetworkMode::Egress => format!(
            "# brig: names are answered by brig's egress resolver, for allowed hosts only\n\
             nameserver {}\noptions ndots:1 timeout:2 attempts:2\n",
            brig_policy::EGRESS_DNS
        ),
    }
}

/// /etc of an image is the image's own; brig only binds the files that describe this
/// sandbox over it (hosts, hostname, resolv.conf) and, when the image does not know
/// the sandbox's user or group, passwd and group with them added.
fn plan_image_etc(
    spec: &SandboxSpec,
    host_root: &Path,
    ops: &mut Vec<FsOp>,
) -> Result<(), JailError> {
    let RootSource::Layers(layers) = &spec.filesystem.root else {
        return Ok(());
    };
    let layers: Vec<PathBuf> = layers
        .iter()
        .map(|l| host_root.join(l.to_string_lossy().trim_start_matches('/')))
        .collect();
    let id = &spec.identity;
    let resolv = resolv_conf(spec, host_root);
    let mut files = vec![
        ("hosts", hosts(&id.hostname)),
        ("hostname", format!("{}\n", id.hostname)),
        ("resolv.conf", resolv),
    ];
    // Builds keep the image's own databases: package scripts edit them in place.
    if id.mapping == IdMapping::Single {
        let base_passwd = read_layered(&layers, "etc/passwd");
        let base_group = read_layered(&layers, "etc/group");
        if !base_passwd
            .as_deref()
            .is_some_and(|db| has_id(db, id.uid, 2))
        {
            files.push((
                "passwd",
                passwd(id.uid, id.gid, id.user_name(), base_passwd.as_deref()),
            ));
        }
        if !base_group
            .as_deref()
            .is_some_and(|db| has_id(db, id.gid, 2))
        {
            files.push((
                "group",
                group(id.gid, id.user_name(), base_group.as_deref()),
            ));
        }
    }
    ops.push(FsOp::Dir {
        path: "/etc".into(),
        mode: 0o755,
    });
    for (name, contents) in files {
        ops.push(FsOp::Generated {
            path: format!("/etc/{name}"),
            contents: contents.into_bytes(),
        });
    }
    plan_ca_bundle(spec, host_root, ops);
    Ok(())
}

pub use brig_sys::layered::{read_layered, MAX_LAYERED_READ};

fn has_id(db: &str, id: u32, field: usize) -> bool {
    db.lines().any(|line| {
        line.split(':')
            .nth(field)
            .and_then(|v| v.parse::<u32>().ok())
            == Some(id)
    })
}

fn has_name(db: &str, name: &str) -> bool {
    db.lines().any(|line| line.split(':').next() == Some(name))
}

fn unique_name(db: &str, id: u32, name: &str) -> String {
    if has_name(db, name) {
        format!("{name}{id}")
    } else {
        name.to_string()
    }
}

/// /etc/passwd: the base (a rootfs's own, or a minimal root+nobody) plus the sandbox
/// user, named `name` unless the base has that name already.
pub fn passwd(uid: u32, gid: u32, name: &str, base: Option<&str>) -> String {
    let mut db = base
        .unwrap_or(
            "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
        )
        .to_string();
    if !db.is_empty() && !db.ends_with('\n') {
        db.push('\n');
    }
    if !has_id(&db, uid, 2) {
        let name = unique_name(&db, uid, name);
        db.push_str(&format!(
            "{name}:x:{uid}:{gid}:{name}:{}:/bin/sh\n",
            defaults::WORKSPACE
        ));
    }
    db
}

/// /etc/group: the base plus the sandbox user's group.
pub fn group(gid: u32, name: &str, base: Option<&str>) -> String {
    let mut db = base.unwrap_or("root:x:0:\nnogroup:x:65534:\n").to_string();
    if !db.is_empty() && !db.ends_with('\n') {
        db.push('\n');
    }
    if !has_id(&db, gid, 2) {
        let name = unique_name(&db, gid, name);
        db.push_str(&format!("{name}:x:{gid}:\n"));
    }
    db
}

pub fn hosts(hostname: &str) -> String {
    format!(
        "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t{hostname}\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use brig_policy::BindMount;
    use std::os::unix::fs::symlink;

    /// A fake host: merged-usr symlinks, a few /etc files, device stand-ins.
    fn fake_host() -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        let p = root.path();
        for dir in [
            "usr/bin",
            "usr/lib",
            "etc/ssl/certs",
            "etc/ssl/private",
            "etc/ssh",
            "dev",
            "data",
        ] {
            std::fs::create_dir_all(p.join(dir)).unwrap();
        }
        symlink("usr/bin", p.join("bin")).unwrap();
        symlink("usr/lib", p.join("lib")).unwrap();
        std::fs::write(p.join("etc/ld.so.cache"), b"cache").unwrap();
        std::fs::write(p.join("etc/mime.types"), vec![b'#'; 20 << 10]).unwrap();
        std::fs::write(p.join("etc/shadow"), b"root:secret").unwrap();
        std::fs::write(
            p.join("etc/passwd"),
            b"root:x:0:0::/root:/bin/bash\nalice:x:1000:1000::/home/alice:/bin/sh\n",
        )
        .unwrap();
        std::fs::write(p.join("etc/python3.11"), b"").unwrap();
        std::fs::write(p.join("etc/ssl/openssl.cnf"), b"cnf").unwrap();
        std::fs::write(p.join("etc/ssl/private/key.pem"), b"KEY").unwrap();
        std::fs::set_permissions(
            p.join("etc/ssl/openssl.cnf"),
            std::fs::Permissions::from_mode(0o600),
        )
        .unwrap();
        std::fs::write(p.join("etc/ssh/ssh_host_rsa_key"), b"KEY").unwrap();
        symlink("/usr/share/zoneinfo/UTC", p.join("etc/localtime")).unwrap();
        for dev in DEVICES {
            std::fs::write(p.join("dev").join(dev), b"").unwrap();
        }
        root
    }

    fn spec() -> SandboxSpec {
        SandboxSpec::new(vec!["true".into()])
    }

    /// The contents brig writes at `path`.
    fn written(plan: &FsPlan, path: &str) -> String {
        plan.ops
            .iter()
            .find_map(|op| match op {
                FsOp::File {
                    path: p, contents, ..
                } if p == path => Some(String::from_utf8(contents.clone()).unwrap()),
                _ => None,
            })
            .unwrap()
    }

    fn paths(plan: &FsPlan) -> Vec<String> {
        plan.ops.iter().map(|op| op.path().to_string()).collect()
    }

    #[test]
    fn workspace_links_are_symlinks_in_the_host_root_with_their_parents() {
        let host = fake_host();
        let mut s = spec();
        s.filesystem.workspace_links = vec!["/home/user".into()];
        let plan = plan(&s, host.path()).unwrap();
        let home = paths(&plan).iter().position(|p| p == "/home").unwrap();
        let link = paths(&plan).iter().position(|p| p == "/home/user").unwrap();
        assert!(home < link);
        assert!(plan.ops.contains(&FsOp::Symlink {
            path: "/home/user".into(),
            target: "/workspace".into(),
        }));
    }

    #[test]
    fn host_mode_exposes_system_dirs_read_only_and_recreates_symlinks() {
        let host = fake_host();
        let plan = plan(&spec(), host.path()).unwrap();
        assert!(plan.ops.contains(&FsOp::Bind {
            source: host.path().join("usr"),
            path: "/usr".into(),
            kind: NodeKind::Dir,
            access: Access::ReadOnly,
            idmapped: false,
            no_symlinks: false,
        }));
        assert!(plan.ops.contains(&FsOp::Symlink {
            path: "/bin".into(),
            target: "usr/bin".into(),
        }));
        // Absent system dirs are skipped, not errors.
        assert!(!paths(&plan).contains(&"/lib32".to_string()));
    }

    fn generated(plan: &FsPlan, path: &str) -> Option<String> {
        plan.ops.iter().find_map(|op| match op {
            FsOp::Generated { path: p, contents } if p == path => {
                Some(String::from_utf8(contents.clone()).unwrap())
            }
            _ => None,
        })
    }

    #[test]
    fn an_extra_ca_joins_the_roots_bundle_at_brigs_path_and_the_standard_one() {
        let host = fake_host();
        let bundle = host.path().join("etc/ssl/certs/ca-certificates.crt");
        std::fs::write(&bundle, "HOST ROOTS").unwrap();
        assert_eq!(
            generated(
                &plan(&spec(), host.path()).unwrap(),
                "/etc/brig/ca-bundle.crt"
            ),
            None
        );
        let mut spec = spec();
        spec.filesystem.extra_ca = Some("-----BEGIN CERTIFICATE-----\nBRIG\n".into());
        let plan = plan(&spec, host.path()).unwrap();
        let own = generated(&plan, brig_policy::net::CA_BUNDLE).unwrap();
        assert!(
            own.starts_with("HOST ROOTS\n") && own.ends_with("BRIG\n"),
            "{own}"
        );
        let standard = generated(&plan, "/etc/ssl/certs/ca-certificates.crt").unwrap();
        assert_eq!(standard, own);
        // A root without a bundle gets brig's path alone, with brig's CA only.
        std::fs::remove_file(&bundle).unwrap();
        let plan = super::plan(&spec, host.path()).unwrap();
        assert!(generated(&plan, brig_policy::net::CA_BUNDLE)
            .unwrap()
            .ends_with("BRIG\n"));
        assert_eq!(generated(&plan, "/etc/ssl/certs/ca-certificates.crt"), None);
        spec.filesystem.extra_ca = Some("not a certificate".into());
        assert!(spec.validate().is_err());
    }

    #[test]
    fn etc_never_exposes_secrets_or_host_users() {
        let host = fake_host();
        let plan = plan(&spec(), host.path()).unwrap();
        let all = paths(&plan);
        for secret in [
            "/etc/shadow",
            "/etc/ssh",
            "/etc/ssl/private",
            "/etc/ssl/private/key.pem",
        ] {
            assert!(!all.contains(&secret.to_string()), "{secret} exposed");
        }
        for op in &plan.ops {
            if let FsOp::Bind { source, .. } = op {
                let s = source.to_string_lossy();
                assert!(
                    !s.contains("shadow") && !s.contains("ssh") && !s.contains("private"),
                    "{s}"
                );
            }
        }
        let passwd = written(&plan, "/etc/passwd");
        assert!(!passwd.contains("alice"), "host users leaked: {passwd}");
        assert!(passwd.contains("sandbox:x:1000:1000:"));
        // Allowlisted entries: copied when small and world-readable, bound otherwise
        // (so a 0600 host file stays unreadable), symlinks recreated, prefixes matched.
        let stamp = FileStamp::of(&std::fs::metadata(host.path().join("etc/ld.so.cache")).unwrap());
        assert!(plan.ops.contains(&FsOp::Copy {
            source: host.path().join("etc/ld.so.cache"),
            path: "/etc/ld.so.cache".into(),
            mode: 0o644,
            size: 5,
            stamp,
        }));
        assert!(plan.ops.iter().any(|op| matches!(op,
            FsOp::Bind { path, kind: NodeKind::File, access: Access::ReadOnly, .. } if path == "/etc/mime.types")),
            "a world-readable file past the copy limit is bound");
        assert!(plan.ops.iter().any(|op| matches!(op,
            FsOp::Bind { path, kind: NodeKind::File, access: Access::ReadOnly, .. } if path == "/etc/ssl/openssl.cnf")));
        assert!(plan.ops.iter().any(|op| matches!(op,
            FsOp::Bind { path, kind: NodeKind::Dir, .. } if path == "/etc/ssl/certs")));
        assert!(plan.ops.contains(&FsOp::Symlink {
            path: "/etc/localtime".into(),
            target: "/usr/share/zoneinfo/UTC".into(),
        }));
        assert!(all.contains(&"/etc/python3.11".to_string()));
    }

    #[test]
    fn proc_dev_and_scratch_layout() {
        let host = fake_host();
        let plan = plan(&spec(), host.path()).unwrap();
        let all = paths(&plan);
        for must in [
            "/proc/kcore",
            "/proc/keys",
            "/proc/timer_list",
            "/proc/sys",
            "/proc/sysrq-trigger",
            "/dev/null",
            "/dev/urandom",
            "/dev/pts",
            "/dev/shm",
            "/tmp",
            "/workspace",
        ] {
            assert!(all.contains(&must.to_string()), "{must} missing");
        }
        assert!(plan.ops.contains(&FsOp::Mask {
            path: "/proc/kcore".into()
        }));
        assert!(plan.ops.contains(&FsOp::ReadOnly {
            path: "/proc/sys".into()
        }));
        assert!(plan.ops.contains(&FsOp::Scratch {
            dir: ScratchDir::Workspace,
            path: "/workspace".into()
        }));
        assert_eq!(plan.scratch_bytes, 512 << 20);
        assert_eq!(plan.writable, vec!["/tmp", "/dev/shm", "/workspace"]);
        // /dev is sealed only after everything below it is mounted.
        let seal = plan
            .ops
            .iter()
            .position(|op| {
                op == &FsOp::Seal {
                    path: "/dev".into(),
                }
            })
            .unwrap();
        let shm = plan
            .ops
            .iter()
            .position(|op| {
                matches!(
                    op,
                    FsOp::Scratch {
                        dir: ScratchDir::Shm,
                        ..
                    }
                )
            })
            .unwrap();
        assert!(shm < seal);
        // Proc is mounted before it is masked.
        let proc_at = plan
            .ops
            .iter()
            .position(|op| matches!(op, FsOp::Proc { .. }))
            .unwrap();
        let mask_at = plan
            .ops
            .iter()
            .position(|op| matches!(op, FsOp::Mask { .. }))
            .unwrap();
        assert!(proc_at < mask_at);
    }

    #[test]
    fn binds_workspace_and_errors() {
        let host = fake_host();
        let mut s = spec();
        s.filesystem.workspace = Some("/data".into());
        s.filesystem
            .binds
            .push(BindMount::parse("/data:/in/deeper/x").unwrap());
        s.filesystem
            .binds
            .push(BindMount::parse("/data:/in:rw").unwrap());
        let plan = plan(&s, host.path()).unwrap();
        let in_at = paths(&plan).iter().position(|p| p == "/in").unwrap();
        let deep_at = paths(&plan)
            .iter()
            .position(|p| p == "/in/deeper/x")
            .unwrap();
        assert!(in_at < deep_at, "parents must be mounted first");
        assert!(plan.ops.contains(&FsOp::Bind {
            source: host.path().join("data"),
            path: "/workspace".into(),
            kind: NodeKind::Dir,
            access: Access::ReadWrite,
            idmapped: false,
            no_symlinks: false,
        }));
        assert!(plan.writable.contains(&"/in".to_string()));
        assert!(!plan.writable.contains(&"/in/deeper/x".to_string()));

        let mut s = spec();
        s.filesystem
            .binds
            .push(BindMount::parse("/missing:/x").unwrap());
        assert!(matches!(
            plan_err(&s, host.path()),
            JailError::HostPath { .. }
        ));
    }

    fn plan_err(s: &SandboxSpec, host: &Path) -> JailError {
        plan(s, host).unwrap_err()
    }

    #[test]
    fn rootfs_mode_takes_entries_but_not_managed_ones_or_secrets() {
        let host = fake_host();
        let rootfs = host.path().join("rootfs");
        for dir in ["usr/bin", "etc", "proc", "home/app"] {
            std::fs::create_dir_all(rootfs.join(dir)).unwrap();
        }
        std::fs::write(
            rootfs.join("etc/passwd"),
            "root:x:0:0::/root:/bin/sh\napp:x:1000:1000::/home/app:/bin/sh",
        )
        .unwrap();
        std::fs::write(rootfs.join("etc/shadow"), "x").unwrap();
        std::fs::write(rootfs.join("etc/os-release"), "ID=test").unwrap();
        let mut s = spec();
        s.filesystem.root = RootSource::Directory("/rootfs".into());
        let plan = plan(&s, host.path()).unwrap();
        let all = paths(&plan);
        assert!(all.contains(&"/usr".to_string()));
        assert!(all.contains(&"/home".to_string()));
        assert!(all.contains(&"/etc/os-release".to_string()));
        assert!(!all.contains(&"/etc/shadow".to_string()));
        assert!(!plan
            .ops
            .iter()
            .any(|op| matches!(op, FsOp::Bind { path, .. } if path == "/proc")));
        // The rootfs's own users are kept; uid 1000 exists already, so none is added.
        let passwd = written(&plan, "/etc/passwd");
        assert_eq!(
            passwd,
            "root:x:0:0::/root:/bin/sh\napp:x:1000:1000::/home/app:/bin/sh\n"
        );
        s.filesystem.root = RootSource::Directory("/nope".into());
        assert!(matches!(
            plan_err(&s, host.path()),
            JailError::HostPath { .. }
        ));
    }

    #[test]
    fn etc_databases() {
        assert_eq!(
            passwd(1000, 1000, "sandbox", None),
            "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\nsandbox:x:1000:1000:sandbox:/workspace:/bin/sh\n"
        );
        // Another name (E2B's `user`), as long as the base does not have it.
        assert!(passwd(1000, 1000, "user", None)
            .ends_with("\nuser:x:1000:1000:user:/workspace:/bin/sh\n"));
        assert!(group(1000, "user", None).ends_with("\nuser:x:1000:\n"));
        assert!(passwd(7, 7, "user", Some("user:x:1:1::/:/bin/sh"))
            .ends_with("\nuser7:x:7:7:user7:/workspace:/bin/sh\n"));
        // root inside needs no extra entry.
        assert!(!passwd(0, 0, "sandbox", None).contains("sandbox"));
        assert_eq!(
            passwd(7, 7, "sandbox", Some("sandbox:x:1:1::/:/bin/sh")),
            "sandbox:x:1:1::/:/bin/sh\nsandbox7:x:7:7:sandbox7:/workspace:/bin/sh\n"
        );
        assert_eq!(
            group(1000, "sandbox", None),
            "root:x:0:\nnogroup:x:65534:\nsandbox:x:1000:\n"
        );
        assert!(hosts("box").contains("127.0.1.1\tbox\n"));
    }

    #[test]
    fn layered_reads_stay_in_their_layers() {
        use std::os::unix::fs::symlink;
        let tmp = tempfile::tempdir().unwrap();
        let layer = |name: &str| {
            let dir = tmp.path().join(name);
            std::fs::create_dir_all(dir.join("etc")).unwrap();
            dir
        };
        let host = tmp.path().join("host");
        std::fs::create_dir_all(&host).unwrap();
        std::fs::write(host.join("passwd"), "host-secret:x:0:0::/:/bin/sh\n").unwrap();
        let (lower, upper) = (layer("lower"), layer("upper"));
        std::fs::write(lower.join("etc/passwd"), "lower\n").unwrap();
        std::fs::write(upper.join("etc/group"), "upper\n").unwrap();
        let layers = [lower.clone(), upper.clone()];
        // The top layer that has the file wins; a missing one lets lower ones show.
        assert_eq!(
            read_layered(&layers, "etc/passwd").as_deref(),
            Some("lower\n")
        );
        assert_eq!(
            read_layered(&layers, "etc/group").as_deref(),
            Some("upper\n")
        );

        // An image's symlinks never lead out of its layer, relative or absolute,
        // whether the parent or the file itself is the link.
        let climb = "../".repeat(40) + host.to_str().unwrap().trim_start_matches('/');
        for target in [climb.as_str(), host.to_str().unwrap()] {
            std::fs::remove_dir_all(upper.join("etc")).unwrap();
            symlink(target, upper.join("etc")).unwrap();
            assert_eq!(read_layered(&layers, "etc/passwd"), None, "{target}");
            std::fs::remove_file(upper.join("etc")).unwrap();
            std::fs::create_dir(upper.join("etc")).unwrap();
            symlink(format!("{target}/passwd"), upper.join("etc/passwd")).unwrap();
            assert_eq!(read_layered(&layers, "etc/passwd"), None, "{target}");
            std::fs::remove_file(upper.join("etc/passwd")).unwrap();
        }
        // A FIFO hides lower files and is not waited on.
        nix::unistd::mkfifo(&upper.join("etc/passwd"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        assert_eq!(read_layered(&layers, "etc/passwd"), None);
    }
}
