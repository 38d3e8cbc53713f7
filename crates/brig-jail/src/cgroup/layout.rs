//! Where each cgroup controller lives on this host, and where the caller sits.
//!
//! Built from `/proc/self/mountinfo` (which hierarchies are mounted where) and
//! `/proc/self/cgroup` (the caller's cgroup in each hierarchy), plus the v2 root's
//! `cgroup.controllers`. After that it is pure data.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::fs::{self as cgfs, Backend};
use crate::{Context, JailError};

/// The kind of cgroup setup of a host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CgroupVersion {
    /// Only v1 hierarchies.
    V1,
    /// Only the unified (v2) hierarchy.
    V2,
    /// Both: each controller is used from v2 if the v2 root lists it, else from v1.
    Hybrid,
}

/// The hierarchy one controller is used from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Hierarchy {
    V1,
    V2,
}

/// What brig uses cgroups for. In v2, `Cpuacct` (CPU usage) is served by the core
/// file `cpu.stat` and `Freezer` by `cgroup.freeze`, present in every cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Controller {
    Memory,
    Pids,
    Cpu,
    Cpuacct,
    Freezer,
}

impl Controller {
    pub const ALL: [Controller; 5] = [
        Controller::Memory,
        Controller::Pids,
        Controller::Cpu,
        Controller::Cpuacct,
        Controller::Freezer,
    ];

    /// The kernel's name of the controller.
    pub fn name(self) -> &'static str {
        match self {
            Controller::Memory => "memory",
            Controller::Pids => "pids",
            Controller::Cpu => "cpu",
            Controller::Cpuacct => "cpuacct",
            Controller::Freezer => "freezer",
        }
    }
}

/// One mounted v1 hierarchy (one or more co-mounted controllers).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct V1Hierarchy {
    /// Sorted controller names, e.g. `["cpu", "cpuacct"]`.
    pub controllers: Vec<String>,
    pub mount_point: PathBuf,
    /// The caller's own cgroup directory; `None` when it is outside the mounted subtree.
    pub caller_dir: Option<PathBuf>,
}

/// The mounted unified (v2) hierarchy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct V2Hierarchy {
    /// The "v2 root" for brig: the directory where cgroup2 is mounted.
    pub mount_point: PathBuf,
    pub caller_dir: Option<PathBuf>,
    /// The root's `cgroup.controllers`.
    pub controllers: Vec<String>,
}

/// Where each controller lives on this host, and where the caller sits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Layout {
    v1: Vec<V1Hierarchy>,
    v2: Option<V2Hierarchy>,
    #[serde(skip)]
    pub(crate) backend: Backend,
}

/// v1 controllers the kernel knows; other super options (rw, name=..., xattr) are not controllers.
const V1_CONTROLLERS: &[&str] = &[
    "blkio",
    "cpu",
    "cpuacct",
    "cpuset",
    "debug",
    "devices",
    "freezer",
    "hugetlb",
    "memory",
    "misc",
    "net_cls",
    "net_prio",
    "perf_event",
    "pids",
    "rdma",
];

/// The controllers brig may take from v2.
const V2_LIMIT_CONTROLLERS: [Controller; 3] =
    [Controller::Memory, Controller::Pids, Controller::Cpu];

impl Layout {
    /// Reads `/proc/self/mountinfo`, `/proc/self/cgroup` and the v2 root's `cgroup.controllers`.
    pub fn detect() -> Result<Layout, JailError> {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
            .context(|| "cgroup: reading /proc/self/mountinfo".to_string())?;
        let cgroup = std::fs::read_to_string("/proc/self/cgroup")
            .context(|| "cgroup: reading /proc/self/cgroup".to_string())?;
        Layout::build(&mountinfo, &cgroup, Path::new("/"), Backend::Real)
    }

    /// For tests: parses the given texts; every path found in mountinfo is re-rooted
    /// under `fs_root`. When `fs_root` is not `/` the tree is taken to be a fake one of
    /// plain directories standing in for cgroupfs: `mkdir` copies the parent's file
    /// names and `rmdir` removes the files inside first. With `/` it is the real host.
    pub fn from_texts(
        mountinfo: &str,
        proc_self_cgroup: &str,
        fs_root: &Path,
    ) -> Result<Layout, JailError> {
        let backend = if fs_root == Path::new("/") {
            Backend::Real
        } else {
            Backend::FakeTree
        };
        Layout::build(mountinfo, proc_self_cgroup, fs_root, backend)
    }

    fn build(
        mountinfo: &str,
        proc_self_cgroup: &str,
        fs_root: &Path,
        backend: Backend,
    ) -> Result<Layout, JailError> {
        let mounts = parse_mountinfo(mountinfo);
        let memberships = parse_proc_cgroup(proc_self_cgroup);
        let reroot = |mount_point: &str| fs_root.join(mount_point.trim_start_matches('/'));

        // v1: group mounts by their controller set (a hierarchy can be mounted twice).
        let mut v1: Vec<V1Hierarchy> = Vec::new();
        let mut sets: Vec<Vec<String>> = Vec::new();
        for mount in mounts.iter().filter(|m| m.fstype == "cgroup") {
            let set = v1_controllers(&mount.super_opts);
            if !set.is_empty() && !sets.contains(&set) {
                sets.push(set);
            }
        }
        for set in sets {
            let caller = memberships
                .iter()
                .find(|(controllers, _)| {
                    let listed: Vec<String> = controllers
                        .iter()
                        .filter(|c| V1_CONTROLLERS.contains(&c.as_str()))
                        .cloned()
                        .collect();
                    listed.iter().any(|c| set.contains(c))
                })
                .map(|(_, path)| path.as_str());
            let candidates: Vec<&Mount> = mounts
                .iter()
                .filter(|m| m.fstype == "cgroup" && v1_controllers(&m.super_opts) == set)
                .collect();
            let (mount, caller_dir) = pick_mount(&candidates, caller);
            v1.push(V1Hierarchy {
                controllers: set,
                mount_point: reroot(&mount.mount_point),
                caller_dir: caller_dir.map(|rel| below(&reroot(&mount.mount_point), &rel)),
            });
        }

        let v2_mounts: Vec<&Mount> = mounts.iter().filter(|m| m.fstype == "cgroup2").collect();
        let v2 = if v2_mounts.is_empty() {
            None
        } else {
            let caller = memberships
                .iter()
                .find(|(controllers, _)| controllers.is_empty())
                .map(|(_, path)| path.as_str());
            let (mount, caller_dir) = pick_mount(&v2_mounts, caller);
            let mount_point = reroot(&mount.mount_point);
            let list = mount_point.join("cgroup.controllers");
            let controllers = match cgfs::read(&list) {
                Ok(text) => text.split_whitespace().map(str::to_string).collect(),
                Err(err) => {
                    tracing::warn!(
                        "cgroup: cannot read {}: {err}; assuming no v2 controllers",
                        list.display()
                    );
                    Vec::new()
                }
            };
            Some(V2Hierarchy {
                caller_dir: caller_dir.map(|rel| below(&mount_point, &rel)),
                mount_point,
                controllers,
            })
        };

        if v1.is_empty() && v2.is_none() {
            return Err(JailError::Cgroup(
                "no cgroup filesystem is mounted (none in /proc/self/mountinfo): mount cgroup2 on /sys/fs/cgroup or run without cgroup limits"
                    .to_string(),
            ));
        }
        Ok(Layout { v1, v2, backend })
    }

    pub fn version(&self) -> CgroupVersion {
        match (self.v1.is_empty(), self.v2.is_some()) {
            (false, false) => CgroupVersion::V1,
            (true, _) => CgroupVersion::V2,
            (false, true) => CgroupVersion::Hybrid,
        }
    }

    pub fn v1_hierarchies(&self) -> &[V1Hierarchy] {
        &self.v1
    }

    pub fn v2(&self) -> Option<&V2Hierarchy> {
        self.v2.as_ref()
    }

    /// Where `controller` is used from on this host; `None` if nowhere.
    pub fn source(&self, controller: Controller) -> Option<Hierarchy> {
        match controller {
            Controller::Memory | Controller::Pids | Controller::Cpu => {
                if self.v2_lists(controller) {
                    Some(Hierarchy::V2)
                } else if self.v1_index(controller).is_some() {
                    Some(Hierarchy::V1)
                } else {
                    None
                }
            }
            Controller::Cpuacct => {
                if self.v2_lists(Controller::Cpu) {
                    Some(Hierarchy::V2)
                } else if self.v1_index(Controller::Cpuacct).is_some() {
                    Some(Hierarchy::V1)
                } else if self.uses_v2_leaf() {
                    Some(Hierarchy::V2)
                } else {
                    None
                }
            }
            Controller::Freezer => {
                if self.version() == CgroupVersion::V2 {
                    Some(Hierarchy::V2)
                } else if self.v1_index(Controller::Freezer).is_some() {
                    Some(Hierarchy::V1)
                } else if self.uses_v2_leaf() {
                    Some(Hierarchy::V2)
                } else {
                    None
                }
            }
        }
    }

    /// Whether a sandbox gets a v2 leaf: always on pure v2; on hybrid hosts only when a
    /// controller comes from v2. (On hybrid systemd hosts the unified hierarchy tracks
    /// services; moving a sandbox there for nothing would hide it from its service.)
    pub(crate) fn uses_v2_leaf(&self) -> bool {
        match self.version() {
            CgroupVersion::V1 => false,
            CgroupVersion::V2 => true,
            CgroupVersion::Hybrid => V2_LIMIT_CONTROLLERS.iter().any(|&c| self.v2_lists(c)),
        }
    }

    fn v2_lists(&self, controller: Controller) -> bool {
        self.v2
            .as_ref()
            .is_some_and(|v2| v2.controllers.iter().any(|c| c == controller.name()))
    }

    /// Index into `v1_hierarchies()` of the hierarchy holding `controller`.
    pub(crate) fn v1_index(&self, controller: Controller) -> Option<usize> {
        self.v1
            .iter()
            .position(|h| h.controllers.iter().any(|c| c == controller.name()))
    }
}

struct Mount {
    /// The mount's root inside its filesystem (for cgroups: a cgroup path).
    root: String,
    mount_point: String,
    fstype: String,
    super_opts: String,
}

/// Parses mountinfo lines:
/// `ID PARENT MAJ:MIN ROOT MOUNT_POINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER_OPTIONS`.
fn parse_mountinfo(text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let separator = fields.iter().skip(6).position(|f| *f == "-")? + 6;
            Some(Mount {
                root: unescape(fields.get(3)?),
                mount_point: unescape(fields.get(4)?),
                fstype: fields.get(separator + 1)?.to_string(),
                super_opts: fields.get(separator + 3).unwrap_or(&"").to_string(),
            })
        })
        .collect()
}

/// Undoes mountinfo's octal escapes (`\040` for a space, `\134` for a backslash...).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 4 <= bytes.len() {
            let digits = &bytes[i + 1..i + 4];
            if digits.iter().all(|b| (b'0'..=b'7').contains(b)) {
                let value = digits
                    .iter()
                    .fold(0u32, |acc, b| acc * 8 + u32::from(b - b'0'));
                if let Ok(value) = u8::try_from(value) {
                    out.push(value);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn v1_controllers(super_opts: &str) -> Vec<String> {
    let set: BTreeSet<&str> = super_opts
        .split(',')
        .filter(|opt| V1_CONTROLLERS.contains(opt))
        .collect();
    set.into_iter().map(str::to_string).collect()
}

/// `/proc/self/cgroup` lines `ID:CONTROLLERS:PATH` as (controllers, path); v2 has none.
fn parse_proc_cgroup(text: &str) -> Vec<(Vec<String>, String)> {
    text.lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let _id = parts.next()?;
            let controllers = parts.next()?;
            let path = parts.next()?;
            let controllers = controllers
                .split(',')
                .filter(|c| !c.is_empty())
                .map(str::to_string)
                .collect();
            Some((controllers, path.to_string()))
        })
        .collect()
}

/// Picks the mount of a hierarchy that shows most of it (shortest root) among those
/// containing the caller's cgroup, and returns the caller's directory relative to it.
fn pick_mount<'a>(candidates: &[&'a Mount], caller: Option<&str>) -> (&'a Mount, Option<PathBuf>) {
    let mut best: Option<(&Mount, PathBuf)> = None;
    if let Some(caller) = caller {
        for &mount in candidates {
            if let Some(rel) = relative_to(caller, &mount.root) {
                let better = match &best {
                    None => true,
                    Some((current, _)) => {
                        (mount.root.len(), mount.mount_point.len())
                            < (current.root.len(), current.mount_point.len())
                    }
                };
                if better {
                    best = Some((mount, rel));
                }
            }
        }
    }
    match best {
        Some((mount, rel)) => (mount, Some(rel)),
        None => {
            let mount = candidates
                .iter()
                .min_by_key(|m| (m.root.len(), m.mount_point.len()))
                .copied()
                .expect("pick_mount is called with at least one candidate");
            (mount, None)
        }
    }
}

/// `dir/rel` without a trailing slash when `rel` is empty.
fn below(dir: &Path, rel: &Path) -> PathBuf {
    if rel.as_os_str().is_empty() {
        dir.to_path_buf()
    } else {
        dir.join(rel)
    }
}

/// `path` relative to `root` when `path` is `root` or below it (by whole components).
fn relative_to(path: &str, root: &str) -> Option<PathBuf> {
    let path = path.trim_end_matches('/');
    let root = root.trim_end_matches('/');
    let rest = if root.is_empty() {
        path
    } else if path == root {
        ""
    } else {
        let rest = path.strip_prefix(root)?;
        if !rest.starts_with('/') {
            return None;
        }
        rest
    };
    let rel: PathBuf = rest.split('/').filter(|c| !c.is_empty()).collect();
    if rel.components().any(|c| c.as_os_str() == "..") {
        return None;
    }
    Some(rel)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cgroup lines of this project's CI host (v1 hybrid, no systemd).
    use crate::cgroup::tests::{HYBRID_CGROUP, HYBRID_MOUNTINFO};

    #[test]
    fn hybrid_host_layout() {
        let root = tempfile::tempdir().unwrap();
        let unified = root.path().join("sys/fs/cgroup/unified");
        std::fs::create_dir_all(&unified).unwrap();
        std::fs::write(unified.join("cgroup.controllers"), "hugetlb\n").unwrap();
        let layout = Layout::from_texts(HYBRID_MOUNTINFO, HYBRID_CGROUP, root.path()).unwrap();
        assert_eq!(layout.version(), CgroupVersion::Hybrid);
        assert_eq!(layout.backend, Backend::FakeTree);
        // The named systemd hierarchy is not a controller hierarchy.
        let names: Vec<Vec<String>> = layout
            .v1_hierarchies()
            .iter()
            .map(|h| h.controllers.clone())
            .collect();
        assert_eq!(names.len(), 8, "{names:?}");
        let memory = &layout.v1_hierarchies()[layout.v1_index(Controller::Memory).unwrap()];
        assert_eq!(memory.mount_point, root.path().join("sys/fs/cgroup/memory"));
        assert_eq!(
            memory.caller_dir.as_deref(),
            Some(
                root.path()
                    .join("sys/fs/cgroup/memory/process_api/8b73")
                    .as_path()
            )
        );
        assert_ne!(
            layout.v1_index(Controller::Cpu),
            layout.v1_index(Controller::Cpuacct)
        );
        for c in Controller::ALL {
            assert_eq!(layout.source(c), Some(Hierarchy::V1), "{c:?}");
        }
        assert!(!layout.uses_v2_leaf());
        assert_eq!(
            layout.v2().unwrap().controllers,
            vec!["hugetlb".to_string()]
        );
        assert_eq!(
            layout.v2().unwrap().caller_dir.as_deref(),
            Some(unified.as_path())
        );
    }

    #[test]
    fn hybrid_takes_listed_controllers_from_v2() {
        let root = tempfile::tempdir().unwrap();
        let unified = root.path().join("sys/fs/cgroup/unified");
        std::fs::create_dir_all(&unified).unwrap();
        std::fs::write(unified.join("cgroup.controllers"), "memory pids\n").unwrap();
        let mountinfo = HYBRID_MOUNTINFO
            .lines()
            .filter(|l| !l.contains("rw,memory") && !l.contains("rw,pids"))
            .collect::<Vec<_>>()
            .join("\n");
        let layout = Layout::from_texts(&mountinfo, HYBRID_CGROUP, root.path()).unwrap();
        assert_eq!(layout.version(), CgroupVersion::Hybrid);
        assert_eq!(layout.source(Controller::Memory), Some(Hierarchy::V2));
        assert_eq!(layout.source(Controller::Pids), Some(Hierarchy::V2));
        assert_eq!(layout.source(Controller::Cpu), Some(Hierarchy::V1));
        assert_eq!(layout.source(Controller::Cpuacct), Some(Hierarchy::V1));
        assert_eq!(layout.source(Controller::Freezer), Some(Hierarchy::V1));
        assert!(layout.uses_v2_leaf());
    }

    #[test]
    fn pure_v2_layout() {
        let root = tempfile::tempdir().unwrap();
        let mountinfo = "25 20 0:22 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n";
        let layout =
            Layout::from_texts(mountinfo, "0::/system.slice/brig.service\n", root.path()).unwrap();
        assert_eq!(layout.version(), CgroupVersion::V2);
        // No cgroup.controllers in the fake tree: nothing listed.
        assert_eq!(layout.source(Controller::Memory), None);
        assert_eq!(layout.source(Controller::Cpuacct), Some(Hierarchy::V2));
        assert_eq!(layout.source(Controller::Freezer), Some(Hierarchy::V2));
        assert_eq!(
            layout.v2().unwrap().caller_dir,
            Some(root.path().join("sys/fs/cgroup/system.slice/brig.service"))
        );
    }

    #[test]
    fn comounted_v1_and_escaped_mount_points() {
        let root = tempfile::tempdir().unwrap();
        let mountinfo = "\
30 25 0:26 / /sys/fs/cgroup/cpu,cpuacct rw shared:11 master:3 - cgroup cgroup rw,cpu,cpuacct
31 25 0:27 /docker/abc /my\\040cgroups/memory rw - cgroup cgroup rw,memory
32 25 0:27 /docker /other/memory rw - cgroup cgroup rw,memory
";
        let cgroup = "3:cpuacct,cpu:/user/1\n2:memory:/docker/abc/sub\n";
        let layout = Layout::from_texts(mountinfo, cgroup, root.path()).unwrap();
        assert_eq!(layout.version(), CgroupVersion::V1);
        assert_eq!(layout.v1_hierarchies().len(), 2);
        let cpu = &layout.v1_hierarchies()[0];
        assert_eq!(
            cpu.controllers,
            vec!["cpu".to_string(), "cpuacct".to_string()]
        );
        assert_eq!(layout.v1_index(Controller::Cpu), Some(0));
        assert_eq!(layout.v1_index(Controller::Cpuacct), Some(0));
        assert_eq!(
            cpu.caller_dir,
            Some(root.path().join("sys/fs/cgroup/cpu,cpuacct/user/1"))
        );
        // Of two mounts containing the caller, the one showing more of the hierarchy wins.
        let memory = &layout.v1_hierarchies()[1];
        assert_eq!(memory.mount_point, root.path().join("other/memory"));
        assert_eq!(
            memory.caller_dir,
            Some(root.path().join("other/memory/abc/sub"))
        );
        assert_eq!(layout.source(Controller::Pids), None);
        assert_eq!(layout.source(Controller::Freezer), None);
    }

    #[test]
    fn caller_outside_the_mounted_subtree() {
        let root = tempfile::tempdir().unwrap();
        let mountinfo =
            "31 25 0:27 /docker/abc /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";
        let layout =
            Layout::from_texts(mountinfo, "2:memory:/docker/abcdef\n", root.path()).unwrap();
        assert_eq!(layout.v1_hierarchies()[0].caller_dir, None);
        let layout = Layout::from_texts(mountinfo, "2:memory:/docker/abc\n", root.path()).unwrap();
        assert_eq!(
            layout.v1_hierarchies()[0].caller_dir,
            Some(root.path().join("sys/fs/cgroup/memory"))
        );
    }

    #[test]
    fn nothing_mounted_is_a_clear_error() {
        let root = tempfile::tempdir().unwrap();
        let mountinfo = "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n\
                         40 31 0:37 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,name=systemd\n";
        let err = Layout::from_texts(mountinfo, "1:name=systemd:/\n", root.path()).unwrap_err();
        assert!(matches!(err, JailError::Cgroup(_)));
        assert!(err.to_string().contains("no cgroup filesystem"), "{err}");
    }

    #[test]
    fn unescapes_octal() {
        assert_eq!(unescape("/a\\040b"), "/a b");
        assert_eq!(unescape("/a\\134b"), "/a\\b");
        assert_eq!(unescape("/a\\04"), "/a\\04");
        assert_eq!(unescape("/plain"), "/plain");
    }

    #[test]
    fn relative_paths() {
        assert_eq!(relative_to("/a/b", "/"), Some(PathBuf::from("a/b")));
        assert_eq!(relative_to("/", "/"), Some(PathBuf::new()));
        assert_eq!(relative_to("/a/b", "/a"), Some(PathBuf::from("b")));
        assert_eq!(relative_to("/a", "/a"), Some(PathBuf::new()));
        assert_eq!(relative_to("/ab", "/a"), None);
        assert_eq!(relative_to("/../x", "/"), None);
    }
}
