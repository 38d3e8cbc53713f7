//! Fake-tree tests: a tempdir stands in for /sys/fs/cgroup (see `fs::Backend::FakeTree`:
//! `mkdir` copies the parent's file names as the kernel creates interface files, and
//! `rmdir` ignores the files inside). Everything else is the production code path.
//! What a fake tree cannot show (the kernel refusing a value, EBUSY, real killing and
//! freezing) is covered by `tests/cgroup.rs` on a real host, as root.

use std::fs as stdfs;
use std::path::{Path, PathBuf};

use brig_policy::Limits;
use tempfile::TempDir;

use super::*;

struct Tree {
    dir: TempDir,
}

impl Tree {
    fn new() -> Tree {
        Tree {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// A cgroup directory holding the given files.
    fn cgroup(&self, rel: &str, files: &[(&str, &str)]) {
        let dir = self.path(rel);
        stdfs::create_dir_all(&dir).unwrap();
        for (name, content) in files {
            stdfs::write(dir.join(name), content).unwrap();
        }
    }

    fn read(&self, rel: &str) -> String {
        stdfs::read_to_string(self.path(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
    }

    fn write(&self, rel: &str, content: &str) {
        stdfs::write(self.path(rel), content).unwrap();
    }

    fn exists(&self, rel: &str) -> bool {
        self.path(rel).exists()
    }

    fn layout(&self, mountinfo: &str, proc_self_cgroup: &str) -> Layout {
        Layout::from_texts(mountinfo, proc_self_cgroup, self.dir.path()).unwrap()
    }

    /// Every directory named `name` anywhere in the tree.
    fn dirs_named(&self, name: &str) -> Vec<PathBuf> {
        fn walk(dir: &Path, name: &str, found: &mut Vec<PathBuf>) {
            for entry in stdfs::read_dir(dir).unwrap() {
                let entry = entry.unwrap();
                if entry.file_type().unwrap().is_dir() {
                    if entry.file_name() == name {
                        found.push(entry.path());
                    }
                    walk(&entry.path(), name, found);
                }
            }
        }
        let mut found = Vec::new();
        walk(self.dir.path(), name, &mut found);
        found
    }
}

fn limits(memory_bytes: Option<u64>, pids: Option<u64>, cpus_millis: Option<u32>) -> Limits {
    Limits {
        memory_bytes,
        pids,
        cpus_millis,
        ..Limits::default()
    }
}

fn cgroup_error(result: Result<Cgroup, JailError>) -> String {
    match result {
        Err(err @ JailError::Cgroup(_)) => err.to_string(),
        Err(other) => panic!("expected a cgroup error, got {other:?}"),
        Ok(cgroup) => panic!("expected an error, got {:?}", cgroup.enforced()),
    }
}

const DEFAULT: CgroupConfig = CgroupConfig { parent: None };
const MIB_64: u64 = 64 << 20;

// ---------------------------------------------------------------- v2

const V2_MOUNTINFO: &str = "\
22 1 0:21 / /proc rw,relatime - proc proc rw
25 20 0:22 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
";
const V2_CGROUP: &str = "0::/system.slice/brig.service\n";

/// Interface files of a v2 cgroup; the fake mkdir copies their names into new cgroups.
const V2_FILES: &[&str] = &[
    "cgroup.procs",
    "cgroup.kill",
    "cgroup.freeze",
    "cgroup.events",
    "cgroup.subtree_control",
    "memory.max",
    "memory.swap.max",
    "memory.events",
    "memory.peak",
    "pids.max",
    "cpu.max",
    "cpu.stat",
];

fn v2_tree(controllers: &str, subtree_control: &str) -> Tree {
    let tree = Tree::new();
    let mut files: Vec<(&str, &str)> = V2_FILES.iter().map(|f| (*f, "")).collect();
    files.push(("cgroup.controllers", controllers));
    files.retain(|(f, _)| *f != "cgroup.subtree_control");
    files.push(("cgroup.subtree_control", subtree_control));
    tree.cgroup("sys/fs/cgroup", &files);
    tree.cgroup(
        "sys/fs/cgroup/system.slice/brig.service",
        &[("cgroup.procs", "1\n")],
    );
    tree
}

#[test]
fn v2_writes_limits_enables_controllers_and_removes_only_the_leaf() {
    let tree = v2_tree("cpuset cpu io memory hugetlb pids rdma misc\n", "");
    let layout = tree.layout(V2_MOUNTINFO, V2_CGROUP);
    assert_eq!(layout.version(), CgroupVersion::V2);
    let cgroup = Cgroup::create(
        &layout,
        &DEFAULT,
        "sb-1",
        &limits(Some(MIB_64), Some(16), Some(500)),
    )
    .unwrap();

    // The default parent is the v2 root, whose subtree_control got exactly what was missing.
    assert_eq!(
        tree.read("sys/fs/cgroup/cgroup.subtree_control"),
        "+memory +pids +cpu"
    );
    let leaf = "sys/fs/cgroup/sb-1";
    assert_eq!(tree.read(&format!("{leaf}/memory.max")), "67108864");
    assert_eq!(tree.read(&format!("{leaf}/memory.swap.max")), "0");
    assert_eq!(tree.read(&format!("{leaf}/pids.max")), "16");
    assert_eq!(tree.read(&format!("{leaf}/cpu.max")), "50000 100000");
    assert_eq!(cgroup.leaf_paths(), vec![tree.path(leaf)]);

    let enforced = cgroup.enforced();
    assert_eq!(enforced.version, CgroupVersion::V2);
    assert!(enforced.notes.is_empty(), "{:?}", enforced.notes);
    assert_eq!(
        enforced.controllers.keys().copied().collect::<Vec<_>>(),
        Controller::ALL.to_vec()
    );
    for controller in enforced.controllers.values() {
        assert_eq!(controller.hierarchy, Hierarchy::V2);
        assert_eq!(controller.leaf, tree.path(leaf));
    }
    let json = serde_json::to_value(&enforced).unwrap();
    assert_eq!(json["version"], "v2");
    assert_eq!(json["controllers"]["memory"]["hierarchy"], "v2");
    assert_eq!(
        json["controllers"]["memory"]["written"]["memory.max"],
        "67108864"
    );
    assert_eq!(
        json["controllers"]["memory"]["written"]["memory.swap.max"],
        "0"
    );
    assert_eq!(json["controllers"]["pids"]["written"]["pids.max"], "16");
    assert_eq!(
        json["controllers"]["cpu"]["written"]["cpu.max"],
        "50000 100000"
    );
    assert_eq!(
        json["controllers"]["freezer"]["written"],
        serde_json::json!({})
    );

    cgroup.add_pid(4242).unwrap();
    assert_eq!(tree.read(&format!("{leaf}/cgroup.procs")), "4242");

    tree.write(
        &format!("{leaf}/memory.events"),
        "low 0\nhigh 0\nmax 12\noom 2\noom_kill 2\noom_group_kill 0\n",
    );
    tree.write(&format!("{leaf}/memory.peak"), "1234567\n");
    tree.write(
        &format!("{leaf}/cpu.stat"),
        "usage_usec 1500\nuser_usec 1000\nsystem_usec 500\nnr_periods 0\n",
    );
    assert_eq!(
        cgroup.stats(),
        CgroupStats {
            oom_kills: 2,
            memory_peak_bytes: Some(1_234_567),
            cpu_time_ns: Some(1_500_000),
        }
    );

    // freeze writes cgroup.freeze and waits for cgroup.events to say so.
    tree.write(&format!("{leaf}/cgroup.events"), "populated 1\nfrozen 1\n");
    cgroup.freeze(true).unwrap();
    assert_eq!(tree.read(&format!("{leaf}/cgroup.freeze")), "1");
    tree.write(&format!("{leaf}/cgroup.events"), "populated 1\nfrozen 0\n");
    cgroup.freeze(false).unwrap();
    assert_eq!(tree.read(&format!("{leaf}/cgroup.freeze")), "0");

    // cgroup.kill is used when present; the kernel would then empty cgroup.procs.
    tree.write(&format!("{leaf}/cgroup.procs"), "");
    cgroup.kill_all().unwrap();
    assert_eq!(tree.read(&format!("{leaf}/cgroup.kill")), "1");

    cgroup.remove().unwrap();
    assert!(!tree.exists(leaf));
    assert!(
        tree.exists("sys/fs/cgroup/memory.max"),
        "the root's files are untouched"
    );
    assert_eq!(
        tree.read("sys/fs/cgroup/system.slice/brig.service/cgroup.procs"),
        "1\n"
    );
    // Already gone is fine.
    cgroup.remove().unwrap();
}

#[test]
fn v2_parent_override_enables_controllers_down_the_chain() {
    let tree = v2_tree("cpu memory pids\n", "memory pids\n");
    let mut brig: Vec<(&str, &str)> = V2_FILES.iter().map(|f| (*f, "")).collect();
    brig.retain(|(f, _)| *f != "cgroup.subtree_control");
    brig.push(("cgroup.subtree_control", "memory pids cpu\n"));
    tree.cgroup("sys/fs/cgroup/brig", &brig);
    let layout = tree.layout(V2_MOUNTINFO, V2_CGROUP);
    let config = CgroupConfig {
        parent: Some("brig/sandboxes".to_string()),
    };
    let cgroup = Cgroup::create(&layout, &config, "sb", &limits(Some(MIB_64), None, None)).unwrap();

    // Only what was missing is written, at every level from the root down to the parent.
    assert_eq!(tree.read("sys/fs/cgroup/cgroup.subtree_control"), "+cpu");
    assert_eq!(
        tree.read("sys/fs/cgroup/brig/cgroup.subtree_control"),
        "memory pids cpu\n"
    );
    assert_eq!(
        tree.read("sys/fs/cgroup/brig/sandboxes/cgroup.subtree_control"),
        "+memory +pids +cpu"
    );
    let leaf = "sys/fs/cgroup/brig/sandboxes/sb";
    assert_eq!(cgroup.leaf_paths(), vec![tree.path(leaf)]);
    assert_eq!(tree.read(&format!("{leaf}/memory.max")), "67108864");
    // Limits not asked for are not written.
    assert_eq!(tree.read(&format!("{leaf}/pids.max")), "");
    assert_eq!(tree.read(&format!("{leaf}/cpu.max")), "");
    let enforced = cgroup.enforced();
    assert!(enforced.controllers[&Controller::Pids].written.is_empty());

    cgroup.remove().unwrap();
    assert!(!tree.exists(leaf));
    assert!(
        tree.exists("sys/fs/cgroup/brig/sandboxes"),
        "parents are kept"
    );
}

#[test]
fn v2_missing_controller_is_a_clear_error_and_leaves_nothing() {
    let tree = v2_tree("cpu pids\n", "");
    let layout = tree.layout(V2_MOUNTINFO, V2_CGROUP);
    let message = cgroup_error(Cgroup::create(
        &layout,
        &DEFAULT,
        "sb",
        &limits(Some(MIB_64), Some(16), None),
    ));
    assert!(
        message.starts_with("cgroup: a memory limit was requested"),
        "{message}"
    );
    assert!(message.contains("cgroup.controllers"), "{message}");
    assert!(tree.dirs_named("sb").is_empty());
    assert_eq!(tree.read("sys/fs/cgroup/cgroup.subtree_control"), "");
}

#[test]
fn v2_without_swap_accounting_notes_it() {
    let tree = v2_tree("memory\n", "");
    stdfs::remove_file(tree.path("sys/fs/cgroup/memory.swap.max")).unwrap();
    let layout = tree.layout(V2_MOUNTINFO, V2_CGROUP);
    let cgroup =
        Cgroup::create(&layout, &DEFAULT, "sb", &limits(Some(MIB_64), None, None)).unwrap();
    let enforced = cgroup.enforced();
    assert!(
        enforced
            .notes
            .iter()
            .any(|n| n.starts_with("swap not limited")),
        "{:?}",
        enforced.notes
    );
    assert_eq!(
        enforced.controllers[&Controller::Memory]
            .written
            .keys()
            .collect::<Vec<_>>(),
        vec!["memory.max"]
    );
    cgroup.remove().unwrap();
}

// ---------------------------------------------------------------- v1

const V1_MOUNTINFO: &str = "\
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:9 - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,nosuid shared:12 - cgroup cgroup rw,memory
37 31 0:34 / /sys/fs/cgroup/freezer rw,nosuid shared:14 - cgroup cgroup rw,freezer
39 31 0:36 / /sys/fs/cgroup/pids rw,nosuid shared:16 - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,nosuid shared:17 - cgroup cgroup rw,xattr,name=systemd
";
const V1_CGROUP: &str = "\
5:name=systemd:/user/1
4:pids:/user/1
3:freezer:/
2:memory:/user/1
1:cpu,cpuacct:/user/1
";

const MEMORY_FILES: &[(&str, &str)] = &[
    ("cgroup.procs", ""),
    ("memory.limit_in_bytes", ""),
    ("memory.memsw.limit_in_bytes", ""),
    ("memory.kmem.tcp.limit_in_bytes", ""),
    ("memory.oom_control", ""),
    ("memory.max_usage_in_bytes", ""),
];
const CPU_FILES: &[(&str, &str)] = &[
    ("cgroup.procs", ""),
    ("cpu.cfs_period_us", ""),
    ("cpu.cfs_quota_us", ""),
];
const CPUACCT_FILES: &[(&str, &str)] = &[("cgroup.procs", ""), ("cpuacct.usage", "")];
const PIDS_FILES: &[(&str, &str)] = &[("cgroup.procs", ""), ("pids.max", "")];
const FREEZER_FILES: &[(&str, &str)] = &[("cgroup.procs", ""), ("freezer.state", "")];

fn v1_tree() -> Tree {
    let tree = Tree::new();
    let cpu: Vec<(&str, &str)> = CPU_FILES.iter().chain(CPUACCT_FILES).copied().collect();
    for dir in ["", "/user", "/user/1"] {
        tree.cgroup(&format!("sys/fs/cgroup/cpu,cpuacct{dir}"), &cpu);
        tree.cgroup(&format!("sys/fs/cgroup/memory{dir}"), MEMORY_FILES);
        tree.cgroup(&format!("sys/fs/cgroup/pids{dir}"), PIDS_FILES);
        tree.cgroup(
            &format!("sys/fs/cgroup/systemd{dir}"),
            &[("cgroup.procs", "")],
        );
    }
    tree.cgroup("sys/fs/cgroup/freezer", FREEZER_FILES);
    tree
}

#[test]
fn v1_comounted_cpu_cpuacct_under_the_callers_cgroups() {
    let tree = v1_tree();
    let layout = tree.layout(V1_MOUNTINFO, V1_CGROUP);
    assert_eq!(layout.version(), CgroupVersion::V1);
    let cgroup = Cgroup::create(
        &layout,
        &DEFAULT,
        "sb",
        &limits(Some(MIB_64), Some(16), Some(1500)),
    )
    .unwrap();

    let cpu = "sys/fs/cgroup/cpu,cpuacct/user/1/sb";
    let memory = "sys/fs/cgroup/memory/user/1/sb";
    let freezer = "sys/fs/cgroup/freezer/sb";
    let pids = "sys/fs/cgroup/pids/user/1/sb";
    assert_eq!(
        cgroup.leaf_paths(),
        [cpu, memory, freezer, pids].map(|l| tree.path(l)).to_vec()
    );
    assert!(
        !tree.exists("sys/fs/cgroup/systemd/user/1/sb"),
        "named hierarchies are left alone"
    );
    assert_eq!(
        tree.read(&format!("{memory}/memory.limit_in_bytes")),
        "67108864"
    );
    assert_eq!(
        tree.read(&format!("{memory}/memory.memsw.limit_in_bytes")),
        "67108864"
    );
    assert_eq!(
        tree.read(&format!("{memory}/memory.kmem.tcp.limit_in_bytes")),
        "67108864"
    );
    assert_eq!(tree.read(&format!("{pids}/pids.max")), "16");
    assert_eq!(tree.read(&format!("{cpu}/cpu.cfs_period_us")), "100000");
    assert_eq!(tree.read(&format!("{cpu}/cpu.cfs_quota_us")), "150000");

    let enforced = cgroup.enforced();
    assert_eq!(enforced.version, CgroupVersion::V1);
    assert!(enforced.notes.is_empty(), "{:?}", enforced.notes);
    assert_eq!(enforced.controllers[&Controller::Cpu].leaf, tree.path(cpu));
    assert_eq!(
        enforced.controllers[&Controller::Cpuacct].leaf,
        tree.path(cpu)
    );
    assert_eq!(
        enforced.controllers[&Controller::Freezer].leaf,
        tree.path(freezer)
    );
    assert!(enforced
        .controllers
        .values()
        .all(|c| c.hierarchy == Hierarchy::V1));
    let json = serde_json::to_value(&enforced).unwrap();
    assert_eq!(json["version"], "v1");
    assert_eq!(json["controllers"]["cpu"]["hierarchy"], "v1");
    assert_eq!(
        json["controllers"]["cpu"]["written"]["cpu.cfs_quota_us"],
        "150000"
    );
    assert_eq!(
        json["controllers"]["memory"]["written"]["memory.memsw.limit_in_bytes"],
        "67108864"
    );

    cgroup.add_pid(4242).unwrap();
    for leaf in [cpu, memory, freezer, pids] {
        assert_eq!(tree.read(&format!("{leaf}/cgroup.procs")), "4242", "{leaf}");
    }

    tree.write(
        &format!("{memory}/memory.oom_control"),
        "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n",
    );
    tree.write(&format!("{memory}/memory.max_usage_in_bytes"), "5000\n");
    tree.write(&format!("{cpu}/cpuacct.usage"), "987654321\n");
    assert_eq!(
        cgroup.stats(),
        CgroupStats {
            oom_kills: 3,
            memory_peak_bytes: Some(5000),
            cpu_time_ns: Some(987_654_321),
        }
    );

    cgroup.freeze(true).unwrap();
    assert_eq!(tree.read(&format!("{freezer}/freezer.state")), "FROZEN");
    cgroup.freeze(false).unwrap();
    assert_eq!(tree.read(&format!("{freezer}/freezer.state")), "THAWED");

    // An empty group is not frozen to be killed: on v1 the first frozen group on
    // the host makes the kernel patch its text on every CPU.
    for leaf in [cpu, memory, freezer, pids] {
        tree.write(&format!("{leaf}/cgroup.procs"), "");
    }
    tree.write(&format!("{freezer}/freezer.state"), "untouched");
    cgroup.kill_all().unwrap();
    assert_eq!(tree.read(&format!("{freezer}/freezer.state")), "untouched");

    cgroup.remove().unwrap();
    assert!(tree.dirs_named("sb").is_empty());
    for parent in ["cpu,cpuacct/user/1", "memory/user/1", "pids/user/1"] {
        assert!(tree.exists(&format!("sys/fs/cgroup/{parent}")), "{parent}");
    }
}

#[test]
fn v1_socket_buffers_are_capped_apart_from_a_large_memory_limit() {
    let tree = v1_tree();
    let layout = tree.layout(V1_MOUNTINFO, V1_CGROUP);
    let cgroup =
        Cgroup::create(&layout, &DEFAULT, "sb", &limits(Some(3 << 30), None, None)).unwrap();
    let memory = "sys/fs/cgroup/memory/user/1/sb";
    assert_eq!(
        tree.read(&format!("{memory}/memory.limit_in_bytes")),
        (3u64 << 30).to_string()
    );
    assert_eq!(
        tree.read(&format!("{memory}/memory.kmem.tcp.limit_in_bytes")),
        (64u64 << 20).to_string()
    );
    cgroup.remove().unwrap();
}

#[test]
fn v1_without_memsw_notes_that_swap_is_not_limited() {
    let tree = v1_tree();
    stdfs::remove_file(tree.path("sys/fs/cgroup/memory/user/1/memory.memsw.limit_in_bytes"))
        .unwrap();
    let layout = tree.layout(V1_MOUNTINFO, V1_CGROUP);
    let cgroup =
        Cgroup::create(&layout, &DEFAULT, "sb", &limits(Some(MIB_64), None, None)).unwrap();
    let enforced = cgroup.enforced();
    assert!(
        enforced
            .notes
            .iter()
            .any(|n| n.starts_with("swap not limited")),
        "{:?}",
        enforced.notes
    );
    assert_eq!(
        enforced.controllers[&Controller::Memory]
            .written
            .keys()
            .collect::<Vec<_>>(),
        vec!["memory.kmem.tcp.limit_in_bytes", "memory.limit_in_bytes"]
    );
    cgroup.remove().unwrap();
}

#[test]
fn v1_parent_override() {
    let tree = v1_tree();
    let layout = tree.layout(V1_MOUNTINFO, V1_CGROUP);
    let config = CgroupConfig {
        parent: Some("/brig/sandboxes/".to_string()),
    };
    let cgroup = Cgroup::create(
        &layout,
        &config,
        "sb",
        &limits(Some(MIB_64), Some(16), None),
    )
    .unwrap();
    let expected: Vec<PathBuf> = ["cpu,cpuacct", "memory", "freezer", "pids"]
        .iter()
        .map(|h| tree.path(&format!("sys/fs/cgroup/{h}/brig/sandboxes/sb")))
        .collect();
    assert_eq!(cgroup.leaf_paths(), expected);
    assert_eq!(
        tree.read("sys/fs/cgroup/memory/brig/sandboxes/sb/memory.limit_in_bytes"),
        "67108864"
    );
    assert!(!tree.exists("sys/fs/cgroup/memory/user/1/sb"));
    cgroup.remove().unwrap();
    assert!(tree.dirs_named("sb").is_empty());
    assert!(
        tree.exists("sys/fs/cgroup/memory/brig/sandboxes"),
        "parents are kept"
    );
}

#[test]
fn v1_missing_hierarchy_is_a_clear_error_and_leaves_nothing() {
    let tree = v1_tree();
    let mountinfo: String = V1_MOUNTINFO
        .lines()
        .filter(|l| !l.contains("rw,pids"))
        .map(|l| format!("{l}\n"))
        .collect();
    let layout = tree.layout(&mountinfo, V1_CGROUP);
    let message = cgroup_error(Cgroup::create(
        &layout,
        &DEFAULT,
        "sb",
        &limits(Some(MIB_64), Some(16), Some(500)),
    ));
    assert!(
        message.contains("a pids limit was requested but no v1 'pids' hierarchy"),
        "{message}"
    );
    assert!(tree.dirs_named("sb").is_empty());
    // Without a pids limit the same layout is fine.
    let cgroup =
        Cgroup::create(&layout, &DEFAULT, "sb", &limits(Some(MIB_64), None, None)).unwrap();
    assert_eq!(cgroup.leaf_paths().len(), 3);
    cgroup.remove().unwrap();
}

#[test]
fn failure_after_some_leaves_removes_them() {
    let tree = v1_tree();
    // A kernel without CFS bandwidth control: the cpu hierarchy has no quota file.
    stdfs::remove_file(tree.path("sys/fs/cgroup/cpu,cpuacct/user/1/cpu.cfs_quota_us")).unwrap();
    // Put memory first so its leaf exists when cpu fails.
    let mountinfo: String = V1_MOUNTINFO
        .lines()
        .filter(|l| l.contains("rw,memory"))
        .chain(V1_MOUNTINFO.lines().filter(|l| !l.contains("rw,memory")))
        .map(|l| format!("{l}\n"))
        .collect();
    let layout = tree.layout(&mountinfo, V1_CGROUP);
    let message = cgroup_error(Cgroup::create(
        &layout,
        &DEFAULT,
        "sb",
        &limits(Some(MIB_64), Some(16), Some(500)),
    ));
    assert!(message.contains("cpu.cfs_quota_us"), "{message}");
    assert!(message.contains("kernel does not provide"), "{message}");
    assert!(
        tree.dirs_named("sb").is_empty(),
        "{:?}",
        tree.dirs_named("sb")
    );
}

#[test]
fn existing_leaf_is_refused_and_left_alone() {
    let tree = v1_tree();
    tree.cgroup("sys/fs/cgroup/freezer/sb", &[("marker", "someone else's")]);
    let layout = tree.layout(V1_MOUNTINFO, V1_CGROUP);
    // The freezer is optional here: an existing leaf is still an error.
    let message = cgroup_error(Cgroup::create(
        &layout,
        &DEFAULT,
        "sb",
        &limits(Some(MIB_64), None, None),
    ));
    assert!(message.contains("freezer/sb"), "{message}");
    assert!(message.contains("pick another name"), "{message}");
    assert_eq!(
        tree.read("sys/fs/cgroup/freezer/sb/marker"),
        "someone else's"
    );
    assert_eq!(
        tree.dirs_named("sb"),
        vec![tree.path("sys/fs/cgroup/freezer/sb")]
    );
}

#[test]
fn unusable_optional_hierarchy_is_skipped_with_a_note() {
    let tree = v1_tree();
    // The freezer is mounted but its directory cannot be written (here: missing).
    stdfs::remove_dir_all(tree.path("sys/fs/cgroup/freezer")).unwrap();
    let layout = tree.layout(V1_MOUNTINFO, V1_CGROUP);
    let cgroup = Cgroup::create(
        &layout,
        &DEFAULT,
        "sb",
        &limits(Some(MIB_64), Some(16), Some(500)),
    )
    .unwrap();
    let enforced = cgroup.enforced();
    assert_eq!(enforced.leaves.len(), 3);
    assert!(!enforced.controllers.contains_key(&Controller::Freezer));
    assert!(
        enforced
            .notes
            .iter()
            .any(|n| n.starts_with("v1 freezer not used")),
        "{:?}",
        enforced.notes
    );
    let err = cgroup.freeze(true).unwrap_err().to_string();
    assert!(err.contains("no freezer"), "{err}");
    cgroup.remove().unwrap();
    assert!(tree.dirs_named("sb").is_empty());
}

#[test]
fn caller_outside_the_mount_needs_a_parent() {
    let tree = Tree::new();
    tree.cgroup("sys/fs/cgroup/memory", MEMORY_FILES);
    let mountinfo = "35 31 0:32 /docker/abc /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";
    let layout = tree.layout(mountinfo, "2:memory:/elsewhere\n");
    let message = cgroup_error(Cgroup::create(
        &layout,
        &DEFAULT,
        "sb",
        &limits(Some(MIB_64), None, None),
    ));
    assert!(message.contains("pass a cgroup parent"), "{message}");
    let config = CgroupConfig {
        parent: Some(String::new()),
    };
    let cgroup = Cgroup::create(&layout, &config, "sb", &limits(Some(MIB_64), None, None)).unwrap();
    assert_eq!(
        cgroup.leaf_paths(),
        vec![tree.path("sys/fs/cgroup/memory/sb")]
    );
    cgroup.remove().unwrap();
}

// ---------------------------------------------------------------- hybrid

/// The cgroup lines of this project's CI host (v1 hybrid, no systemd).
pub(super) const HYBRID_MOUNTINFO: &str = "\
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard,resv_strict,resuid=65534,resgid=65534
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
38 31 0:35 / /sys/fs/cgroup/blkio rw,relatime - cgroup cgroup rw,blkio
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
pub(super) const HYBRID_CGROUP: &str = "\
9:name=systemd:/
8:pids:/
7:blkio:/
6:freezer:/
5:devices:/
4:memory:/process_api/8b73
3:cpuset:/
2:cpuacct:/
1:cpu:/
0::/
";

fn hybrid_tree(v2_controllers: &str) -> Tree {
    let tree = Tree::new();
    tree.cgroup("sys/fs/cgroup/cpu", CPU_FILES);
    tree.cgroup("sys/fs/cgroup/cpuacct", CPUACCT_FILES);
    tree.cgroup("sys/fs/cgroup/memory/process_api/8b73", MEMORY_FILES);
    tree.cgroup("sys/fs/cgroup/freezer", FREEZER_FILES);
    tree.cgroup("sys/fs/cgroup/pids", PIDS_FILES);
    for other in ["cpuset", "devices", "blkio", "systemd"] {
        tree.cgroup(&format!("sys/fs/cgroup/{other}"), &[("cgroup.procs", "")]);
    }
    let mut unified: Vec<(&str, &str)> = V2_FILES.iter().map(|f| (*f, "")).collect();
    unified.push(("cgroup.controllers", v2_controllers));
    tree.cgroup("sys/fs/cgroup/unified", &unified);
    tree
}

#[test]
fn hybrid_like_the_ci_host_uses_v1_for_everything() {
    let tree = hybrid_tree("hugetlb\n");
    let layout = tree.layout(HYBRID_MOUNTINFO, HYBRID_CGROUP);
    assert_eq!(layout.version(), CgroupVersion::Hybrid);
    let cgroup = Cgroup::create(
        &layout,
        &DEFAULT,
        "sb",
        &limits(Some(MIB_64), Some(16), Some(500)),
    )
    .unwrap();
    let leaves = [
        "sys/fs/cgroup/cpu/sb",
        "sys/fs/cgroup/cpuacct/sb",
        "sys/fs/cgroup/memory/process_api/8b73/sb",
        "sys/fs/cgroup/freezer/sb",
        "sys/fs/cgroup/pids/sb",
    ];
    assert_eq!(cgroup.leaf_paths(), leaves.map(|l| tree.path(l)).to_vec());
    // No v2 leaf when no controller comes from v2; unused hierarchies untouched.
    assert_eq!(tree.dirs_named("sb").len(), leaves.len());
    assert_eq!(
        tree.read("sys/fs/cgroup/unified/cgroup.subtree_control"),
        ""
    );
    assert_eq!(tree.read("sys/fs/cgroup/cpu/sb/cpu.cfs_quota_us"), "50000");
    assert_eq!(
        tree.read("sys/fs/cgroup/memory/process_api/8b73/sb/memory.limit_in_bytes"),
        "67108864"
    );
    let enforced = cgroup.enforced();
    assert_eq!(
        serde_json::to_value(&enforced).unwrap()["version"],
        "hybrid"
    );
    assert_eq!(
        enforced.controllers[&Controller::Cpuacct].leaf,
        tree.path("sys/fs/cgroup/cpuacct/sb")
    );
    tree.write("sys/fs/cgroup/cpuacct/sb/cpuacct.usage", "42\n");
    assert_eq!(cgroup.stats().cpu_time_ns, Some(42));
    cgroup.remove().unwrap();
    assert!(tree.dirs_named("sb").is_empty());
}

#[test]
fn v1_leaves_only_for_what_limits_and_uses_need() {
    let tree = hybrid_tree("hugetlb\n");
    let layout = tree.layout(HYBRID_MOUNTINFO, HYBRID_CGROUP);
    let one_shot = Uses {
        cpu_accounting: false,
        freezer: false,
    };
    // A one-shot run with every default limit: no cpuacct or freezer leaf.
    let cgroup = Cgroup::create_for(
        &layout,
        &DEFAULT,
        "run",
        &limits(Some(MIB_64), Some(16), Some(500)),
        one_shot,
    )
    .unwrap();
    let leaves = [
        "sys/fs/cgroup/cpu/run",
        "sys/fs/cgroup/memory/process_api/8b73/run",
        "sys/fs/cgroup/pids/run",
    ];
    assert_eq!(cgroup.leaf_paths(), leaves.map(|l| tree.path(l)).to_vec());
    assert_eq!(tree.dirs_named("run").len(), leaves.len());
    assert!(cgroup.freeze(true).is_err(), "froze without a freezer");
    cgroup.remove().unwrap();
    // No limits at all: memory stays for peak and OOM accounting.
    let cgroup = Cgroup::create_for(
        &layout,
        &DEFAULT,
        "bare",
        &limits(None, None, None),
        one_shot,
    )
    .unwrap();
    assert_eq!(
        cgroup.leaf_paths(),
        vec![tree.path("sys/fs/cgroup/memory/process_api/8b73/bare")]
    );
    cgroup.remove().unwrap();
    // A session keeps CPU accounting and the freezer even without CPU limits.
    let cgroup = Cgroup::create_for(
        &layout,
        &DEFAULT,
        "session",
        &limits(Some(MIB_64), None, None),
        Uses::ALL,
    )
    .unwrap();
    let leaves = [
        "sys/fs/cgroup/cpuacct/session",
        "sys/fs/cgroup/memory/process_api/8b73/session",
        "sys/fs/cgroup/freezer/session",
    ];
    assert_eq!(cgroup.leaf_paths(), leaves.map(|l| tree.path(l)).to_vec());
    cgroup.remove().unwrap();
    assert!(tree.dirs_named("session").is_empty());
}

#[test]
fn hybrid_takes_listed_controllers_from_v2() {
    let tree = hybrid_tree("memory pids\n");
    let mountinfo: String = HYBRID_MOUNTINFO
        .lines()
        .filter(|l| !l.contains("rw,memory") && !l.contains("rw,pids"))
        .map(|l| format!("{l}\n"))
        .collect();
    let layout = tree.layout(&mountinfo, HYBRID_CGROUP);
    let cgroup = Cgroup::create(
        &layout,
        &DEFAULT,
        "sb",
        &limits(Some(MIB_64), Some(16), Some(500)),
    )
    .unwrap();
    assert_eq!(
        tree.read("sys/fs/cgroup/unified/cgroup.subtree_control"),
        "+memory +pids"
    );
    assert_eq!(tree.read("sys/fs/cgroup/unified/sb/memory.max"), "67108864");
    assert_eq!(tree.read("sys/fs/cgroup/unified/sb/pids.max"), "16");
    assert_eq!(tree.read("sys/fs/cgroup/cpu/sb/cpu.cfs_quota_us"), "50000");
    let enforced = cgroup.enforced();
    let from: Vec<(Controller, Hierarchy)> = enforced
        .controllers
        .iter()
        .map(|(c, e)| (*c, e.hierarchy))
        .collect();
    assert_eq!(
        from,
        vec![
            (Controller::Memory, Hierarchy::V2),
            (Controller::Pids, Hierarchy::V2),
            (Controller::Cpu, Hierarchy::V1),
            (Controller::Cpuacct, Hierarchy::V1),
            (Controller::Freezer, Hierarchy::V1),
        ]
    );
    assert_eq!(
        cgroup.leaf_paths(),
        ["unified/sb", "cpu/sb", "cpuacct/sb", "freezer/sb"]
            .map(|l| tree.path(&format!("sys/fs/cgroup/{l}")))
            .to_vec()
    );
    cgroup.add_pid(4242).unwrap();
    assert_eq!(tree.read("sys/fs/cgroup/unified/sb/cgroup.procs"), "4242");
    assert_eq!(tree.read("sys/fs/cgroup/cpu/sb/cgroup.procs"), "4242");
    cgroup.remove().unwrap();
    assert!(tree.dirs_named("sb").is_empty());
}

// ---------------------------------------------------------------- odds and ends

#[test]
fn names_and_parents_are_validated() {
    let tree = v1_tree();
    let layout = tree.layout(V1_MOUNTINFO, V1_CGROUP);
    let none = limits(None, None, None);
    for name in ["", ".", "..", "a/b", "../x", "a\nb", "a\0b"] {
        let message = cgroup_error(Cgroup::create(&layout, &DEFAULT, name, &none));
        assert!(
            message.contains("invalid cgroup name"),
            "{name:?}: {message}"
        );
    }
    for parent in ["..", "a/../b", "./a"] {
        let config = CgroupConfig {
            parent: Some(parent.to_string()),
        };
        let message = cgroup_error(Cgroup::create(&layout, &config, "sb", &none));
        assert!(
            message.contains("invalid cgroup parent"),
            "{parent:?}: {message}"
        );
    }
    assert!(tree.dirs_named("sb").is_empty());
}

#[test]
fn stats_edge_cases() {
    let tree = v2_tree("memory pids cpu\n", "");
    let layout = tree.layout(V2_MOUNTINFO, V2_CGROUP);
    let cgroup = Cgroup::create(&layout, &DEFAULT, "sb", &limits(None, None, None)).unwrap();
    let leaf = "sys/fs/cgroup/sb";
    // Empty files (nothing reported yet).
    assert_eq!(cgroup.stats(), CgroupStats::default());
    // A kernel before 4.13 has no oom_kill line; before 5.19 no memory.peak.
    tree.write(
        &format!("{leaf}/memory.events"),
        "low 0\nhigh 0\nmax 0\noom 1\n",
    );
    stdfs::remove_file(tree.path(&format!("{leaf}/memory.peak"))).unwrap();
    tree.write(
        &format!("{leaf}/cpu.stat"),
        "user_usec 5\nusage_usec 18446744073709551615\n",
    );
    assert_eq!(
        cgroup.stats(),
        CgroupStats {
            oom_kills: 0,
            memory_peak_bytes: None,
            cpu_time_ns: Some(u64::MAX),
        }
    );
    // oom_group_kill must not be read as oom_kill; garbage is unknown.
    tree.write(
        &format!("{leaf}/memory.events"),
        "oom_group_kill 4\noom_kill 1\n",
    );
    tree.write(&format!("{leaf}/cpu.stat"), "usage_usec lots\n");
    let stats = cgroup.stats();
    assert_eq!(stats.oom_kills, 1);
    assert_eq!(stats.cpu_time_ns, None);
    cgroup.remove().unwrap();
    // A removed cgroup reports nothing rather than failing.
    assert_eq!(cgroup.stats(), CgroupStats::default());
}

#[test]
fn cgroup_round_trips_through_json() {
    let tree = v1_tree();
    let layout = tree.layout(V1_MOUNTINFO, V1_CGROUP);
    let cgroup = Cgroup::create(
        &layout,
        &DEFAULT,
        "sb",
        &limits(Some(MIB_64), Some(16), Some(500)),
    )
    .unwrap();
    let text = serde_json::to_string(&cgroup).unwrap();
    let back: Cgroup = serde_json::from_str(&text).unwrap();
    assert_eq!(back.enforced(), cgroup.enforced());
    assert_eq!(back.leaf_paths(), cgroup.leaf_paths());
    cgroup.remove().unwrap();
}

#[test]
fn cpu_quota_follows_the_period() {
    assert_eq!(cpu_quota_us(1000), 100_000);
    assert_eq!(cpu_quota_us(500), 50_000);
    assert_eq!(cpu_quota_us(10), 1_000);
    assert_eq!(cpu_quota_us(2500), 250_000);
}

#[test]
fn usage_reads_memory_and_tasks_now_on_v1_and_v2() {
    // v1 (hybrid) with a pids limit: pids.current.
    let tree = hybrid_tree("hugetlb\n");
    let layout = tree.layout(HYBRID_MOUNTINFO, HYBRID_CGROUP);
    let cgroup = Cgroup::create(&layout, &DEFAULT, "sb", &limits(None, Some(16), None)).unwrap();
    let memory = "sys/fs/cgroup/memory/process_api/8b73/sb";
    tree.write(&format!("{memory}/memory.usage_in_bytes"), "1048576\n");
    tree.write(&format!("{memory}/memory.max_usage_in_bytes"), "9999999\n");
    tree.write(&format!("{memory}/tasks"), "11\n12\n13\n");
    tree.write("sys/fs/cgroup/pids/sb/pids.current", "2\n");
    assert_eq!(
        cgroup.usage(),
        CgroupUsage {
            memory_bytes: Some(1 << 20),
            tasks: Some(2)
        }
    );
    cgroup.remove().unwrap();
    assert_eq!(cgroup.usage(), CgroupUsage::default(), "a removed cgroup");

    // v1 without a pids controller in use: the memory cgroup's task list.
    let cgroup = Cgroup::create(&layout, &DEFAULT, "sb", &limits(None, None, None)).unwrap();
    tree.write(&format!("{memory}/memory.usage_in_bytes"), "4096\n");
    tree.write(&format!("{memory}/tasks"), "11\n12\n13\n");
    assert_eq!(
        cgroup.usage(),
        CgroupUsage {
            memory_bytes: Some(4096),
            tasks: Some(3)
        }
    );
    cgroup.remove().unwrap();

    // v2: memory.current (not memory.peak), pids.current; garbage is unknown.
    let tree = v2_tree("memory pids cpu\n", "");
    let layout = tree.layout(V2_MOUNTINFO, V2_CGROUP);
    let leaf = "sys/fs/cgroup/sb";
    let cgroup = Cgroup::create(&layout, &DEFAULT, "sb", &limits(None, Some(8), None)).unwrap();
    tree.write(&format!("{leaf}/memory.current"), "8192\n");
    tree.write(&format!("{leaf}/memory.peak"), "65536\n");
    tree.write(&format!("{leaf}/pids.current"), "5\n");
    assert_eq!(
        cgroup.usage(),
        CgroupUsage {
            memory_bytes: Some(8192),
            tasks: Some(5)
        }
    );
    tree.write(&format!("{leaf}/memory.current"), "lots\n");
    assert_eq!(cgroup.usage().memory_bytes, None);
    cgroup.remove().unwrap();
    // v2 without the pids controller: the leaf's threads.
    let tree = v2_tree("memory cpu\n", "");
    let layout = tree.layout(V2_MOUNTINFO, V2_CGROUP);
    let cgroup = Cgroup::create(&layout, &DEFAULT, "sb", &limits(None, None, None)).unwrap();
    tree.write(&format!("{leaf}/cgroup.threads"), "7\n8\n");
    assert_eq!(cgroup.usage().tasks, Some(2));
    cgroup.remove().unwrap();
}
