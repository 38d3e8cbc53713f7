//! Real cgroups on this host. Every test needs root and prints a line and passes
//! when run as another user. Each test uses its own leaf name (with the test process's
//! pid) and cleans up through drop guards, also when an assertion fails.

use std::io::{Read, Write};
use std::ops::Deref;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use brig_jail::cgroup::{Cgroup, CgroupConfig, CgroupVersion, Controller, Hierarchy, Layout};
use brig_policy::Limits;
use nix::sys::statfs::{statfs, CGROUP2_SUPER_MAGIC, CGROUP_SUPER_MAGIC};

macro_rules! require_root {
    ($test:expr) => {
        if !nix::unistd::geteuid().is_root() {
            println!("skipping {}: needs root (cgroups)", $test);
            return;
        }
    };
}

const MIB_64: u64 = 64 << 20;

fn name(tag: &str) -> String {
    format!("brig-test-{}-{tag}", std::process::id())
}

fn limits(memory_bytes: Option<u64>, pids: Option<u64>, cpus_millis: Option<u32>) -> Limits {
    Limits {
        memory_bytes,
        pids,
        cpus_millis,
        ..Limits::default()
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .trim()
        .to_string()
}

fn procs(leaf: &Path) -> Vec<i32> {
    read(&leaf.join("cgroup.procs"))
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect()
}

/// Kills and removes the cgroup when the test ends, however it ends.
struct CgroupGuard(Cgroup);

impl Deref for CgroupGuard {
    type Target = Cgroup;
    fn deref(&self) -> &Cgroup {
        &self.0
    }
}

impl Drop for CgroupGuard {
    fn drop(&mut self) {
        if let Err(err) = self.0.kill_all() {
            eprintln!("cleanup: {err}");
        }
        if let Err(err) = self.0.remove() {
            eprintln!("cleanup: {err}");
        }
    }
}

/// Kills and reaps a child when the test ends.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl ChildGuard {
    fn pid(&self) -> i32 {
        self.0.id() as i32
    }

    /// Lets a child gated on reading a line from stdin go on.
    fn release(&mut self) {
        let mut stdin = self.0.stdin.take().expect("stdin is piped");
        stdin.write_all(b"go\n").unwrap();
    }
}

fn spawn_gated(program: &str, args: &[&str]) -> ChildGuard {
    ChildGuard(
        Command::new(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{program}: {e}")),
    )
}

fn create(tag: &str, limits: &Limits) -> CgroupGuard {
    let layout = Layout::detect().unwrap();
    CgroupGuard(Cgroup::create(&layout, &CgroupConfig::default(), &name(tag), limits).unwrap())
}

fn leaf_of(cgroup: &Cgroup, controller: Controller) -> PathBuf {
    cgroup.enforced().controllers[&controller].leaf.clone()
}

/// What statfs says the host is, independently of the mountinfo parsing under test.
fn expected_version() -> Option<CgroupVersion> {
    let magic = |path: &str| statfs(path).ok().map(|s| s.filesystem_type());
    if magic("/sys/fs/cgroup") == Some(CGROUP2_SUPER_MAGIC) {
        return Some(CgroupVersion::V2);
    }
    let v1 = magic("/sys/fs/cgroup/memory") == Some(CGROUP_SUPER_MAGIC);
    let v2 = magic("/sys/fs/cgroup/unified") == Some(CGROUP2_SUPER_MAGIC);
    match (v1, v2) {
        (true, true) => Some(CgroupVersion::Hybrid),
        (true, false) => Some(CgroupVersion::V1),
        _ => None,
    }
}

#[test]
fn root_detects_the_hosts_layout() {
    require_root!("root_detects_the_hosts_layout");
    let layout = Layout::detect().unwrap();
    println!("{}", serde_json::to_string_pretty(&layout).unwrap());
    // On the CI host (and this project's dev machine) statfs says hybrid.
    assert_eq!(Some(layout.version()), expected_version());
    if layout.version() == CgroupVersion::Hybrid {
        let memory = Path::new("/sys/fs/cgroup/memory");
        let v1 = layout.v1_hierarchies();
        assert!(v1.iter().any(|h| h.mount_point == memory));
        // The caller's own memory cgroup, as /proc/self/cgroup says.
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        let own = own
            .lines()
            .find_map(|l| l.split_once(":memory:").map(|(_, p)| p.to_string()))
            .unwrap();
        let hierarchy = v1.iter().find(|h| h.mount_point == memory).unwrap();
        assert_eq!(
            hierarchy.caller_dir.as_deref(),
            Some(memory.join(own.trim_start_matches('/')).as_path())
        );
    }
}

#[test]
fn root_limits_are_written_and_processes_join_every_leaf() {
    require_root!("root_limits_are_written_and_processes_join_every_leaf");
    let cgroup = create("limits", &limits(Some(MIB_64), Some(16), Some(500)));
    let enforced = cgroup.enforced();
    println!("{}", serde_json::to_string_pretty(&enforced).unwrap());

    // Every value recorded as written is what the kernel holds now.
    for (controller, e) in &enforced.controllers {
        for (file, value) in &e.written {
            assert_eq!(&read(&e.leaf.join(file)), value, "{controller:?} {file}");
        }
    }
    // And the values are the ones asked for.
    let memory = &enforced.controllers[&Controller::Memory];
    let pids = &enforced.controllers[&Controller::Pids];
    let cpu = &enforced.controllers[&Controller::Cpu];
    match memory.hierarchy {
        Hierarchy::V1 => {
            assert_eq!(read(&memory.leaf.join("memory.limit_in_bytes")), "67108864");
            if memory.leaf.join("memory.memsw.limit_in_bytes").exists() {
                assert_eq!(
                    read(&memory.leaf.join("memory.memsw.limit_in_bytes")),
                    "67108864"
                );
            }
        }
        Hierarchy::V2 => assert_eq!(read(&memory.leaf.join("memory.max")), "67108864"),
    }
    assert_eq!(read(&pids.leaf.join("pids.max")), "16");
    match cpu.hierarchy {
        Hierarchy::V1 => {
            assert_eq!(read(&cpu.leaf.join("cpu.cfs_period_us")), "100000");
            assert_eq!(read(&cpu.leaf.join("cpu.cfs_quota_us")), "50000");
        }
        Hierarchy::V2 => assert_eq!(read(&cpu.leaf.join("cpu.max")), "50000 100000"),
    }

    let mut sleep = ChildGuard(Command::new("sleep").arg("30").spawn().unwrap());
    cgroup.add_pid(sleep.pid()).unwrap();
    for leaf in cgroup.leaf_paths() {
        assert!(procs(&leaf).contains(&sleep.pid()), "{}", leaf.display());
    }
    let own = std::fs::read_to_string(format!("/proc/{}/cgroup", sleep.pid())).unwrap();
    assert!(own.contains(&name("limits")), "{own}");

    // Pause and resume.
    cgroup.freeze(true).unwrap();
    let freezer = &enforced.controllers[&Controller::Freezer];
    match freezer.hierarchy {
        Hierarchy::V1 => assert_eq!(read(&freezer.leaf.join("freezer.state")), "FROZEN"),
        Hierarchy::V2 => assert!(read(&freezer.leaf.join("cgroup.events")).contains("frozen 1")),
    }
    cgroup.freeze(false).unwrap();
    if freezer.hierarchy == Hierarchy::V1 {
        assert_eq!(read(&freezer.leaf.join("freezer.state")), "THAWED");
    }

    let stats = cgroup.stats();
    assert!(stats.cpu_time_ns.is_some(), "{stats:?}");
    assert_eq!(stats.oom_kills, 0);

    cgroup.kill_all().unwrap();
    for leaf in cgroup.leaf_paths() {
        assert!(procs(&leaf).is_empty(), "{}", leaf.display());
    }
    assert_eq!(sleep.0.wait().unwrap().signal(), Some(libc::SIGKILL));

    cgroup.remove().unwrap();
    for leaf in cgroup.leaf_paths() {
        assert!(!leaf.exists(), "{}", leaf.display());
    }
}

#[test]
fn root_pids_limit_stops_a_fork_bomb() {
    require_root!("root_pids_limit_stops_a_fork_bomb");
    let cgroup = create("pids", &limits(Some(MIB_64), Some(16), Some(500)));
    let mut shell = spawn_gated(
        "sh",
        &[
            "-c",
            "read go; for i in $(seq 40); do sleep 10 2>/dev/null & done; wait",
        ],
    );
    cgroup.add_pid(shell.pid()).unwrap();
    shell.release();
    let status = shell.0.wait().unwrap();
    let mut stderr = String::new();
    shell
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    println!("sh: {status}, stderr: {stderr}");
    assert!(
        stderr.to_lowercase().contains("fork"),
        "no fork failure: {stderr:?}"
    );
    assert!(!status.success());

    let leaf = leaf_of(&cgroup, Controller::Pids);
    let events = read(&leaf.join("pids.events"));
    let refused: u64 = events
        .lines()
        .find_map(|l| l.strip_prefix("max "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    assert!(refused > 0, "pids.events: {events}");
    assert!(procs(&leaf).len() <= 16);

    cgroup.kill_all().unwrap();
    assert!(procs(&leaf).is_empty());
    cgroup.remove().unwrap();
    assert!(!leaf.exists());
}

#[test]
fn root_memory_limit_oom_kills() {
    require_root!("root_memory_limit_oom_kills");
    // The interpreter itself, not a wrapper script (pyenv shims fork a lot).
    let python = match Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
    {
        Ok(out) if out.status.success() => {
            String::from_utf8(out.stdout).unwrap().trim().to_string()
        }
        _ => {
            println!("skipping root_memory_limit_oom_kills: python3 not found");
            return;
        }
    };
    let cgroup = create("oom", &limits(Some(MIB_64), Some(16), Some(500)));
    let mut child = spawn_gated(
        &python,
        &[
            "-c",
            "import sys; sys.stdin.readline(); b = bytearray(200 << 20)",
        ],
    );
    cgroup.add_pid(child.pid()).unwrap();
    child.release();
    let status = child.0.wait().unwrap();
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status}");

    let stats = cgroup.stats();
    println!("{stats:?}");
    assert!(stats.oom_kills > 0, "{stats:?}");
    if let Some(peak) = stats.memory_peak_bytes {
        assert!(peak > 0 && peak <= MIB_64, "{stats:?}");
    }
    cgroup.kill_all().unwrap();
    cgroup.remove().unwrap();
}

#[test]
fn root_remove_refuses_while_busy_then_succeeds() {
    require_root!("root_remove_refuses_while_busy_then_succeeds");
    let cgroup = create("busy", &limits(None, Some(16), None));
    let sleep = ChildGuard(Command::new("sleep").arg("30").spawn().unwrap());
    cgroup.add_pid(sleep.pid()).unwrap();
    let err = cgroup.remove().unwrap_err().to_string();
    assert!(err.contains("call kill_all first"), "{err}");
    for leaf in cgroup.leaf_paths() {
        assert!(leaf.exists(), "{}", leaf.display());
    }
    cgroup.kill_all().unwrap();
    drop(sleep);
    cgroup.remove().unwrap();
    for leaf in cgroup.leaf_paths() {
        assert!(!leaf.exists(), "{}", leaf.display());
    }
}

/// Removes the parent directories a test asked brig to create (brig keeps them).
struct ParentGuard(Vec<PathBuf>);

impl Drop for ParentGuard {
    fn drop(&mut self) {
        for dir in &self.0 {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

#[test]
fn root_parent_override() {
    require_root!("root_parent_override");
    let layout = Layout::detect().unwrap();
    let top = name("parent");
    let config = CgroupConfig {
        parent: Some(format!("{top}/sandboxes")),
    };
    let mut parents = Vec::new();
    for mount in layout
        .v1_hierarchies()
        .iter()
        .map(|h| h.mount_point.clone())
        .chain(layout.v2().map(|v2| v2.mount_point.clone()))
    {
        parents.push(mount.join(&top).join("sandboxes"));
        parents.push(mount.join(&top));
    }
    let _parents = ParentGuard(parents);
    let cgroup = CgroupGuard(
        Cgroup::create(
            &layout,
            &config,
            "leaf",
            &limits(Some(MIB_64), Some(16), Some(500)),
        )
        .unwrap(),
    );
    for leaf in cgroup.leaf_paths() {
        assert!(
            leaf.ends_with(format!("{top}/sandboxes/leaf")),
            "{}",
            leaf.display()
        );
        assert!(leaf.is_dir());
    }
    cgroup.remove().unwrap();
    for leaf in cgroup.leaf_paths() {
        assert!(!leaf.exists());
        assert!(leaf.parent().unwrap().is_dir(), "parents are kept");
    }
}

/// The v2 code path on a real cgroup2 mount: on a hybrid host, the unified mount
/// alone (no controllers there, so no limits), seen as a pure v2 layout.
#[test]
fn root_v2_core_files_on_a_real_mount() {
    require_root!("root_v2_core_files_on_a_real_mount");
    let mount = if expected_version() == Some(CgroupVersion::V2) {
        "/sys/fs/cgroup"
    } else if statfs("/sys/fs/cgroup/unified").map(|s| s.filesystem_type())
        == Ok(CGROUP2_SUPER_MAGIC)
    {
        "/sys/fs/cgroup/unified"
    } else {
        println!("skipping root_v2_core_files_on_a_real_mount: no cgroup2 mount");
        return;
    };
    let mountinfo = format!("41 31 0:38 / {mount} rw,relatime - cgroup2 cgroup2 rw\n");
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    let layout = Layout::from_texts(&mountinfo, &own, Path::new("/")).unwrap();
    assert_eq!(layout.version(), CgroupVersion::V2);
    let v2_lists = |c: &str| layout.v2().unwrap().controllers.iter().any(|x| x == c);

    if !v2_lists("memory") {
        // A limit without its controller fails and leaves nothing behind.
        let err = Cgroup::create(
            &layout,
            &CgroupConfig::default(),
            &name("v2-nomem"),
            &limits(Some(MIB_64), None, None),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("memory limit was requested"), "{err}");
        assert!(!Path::new(mount).join(name("v2-nomem")).exists());
    }

    let cgroup = CgroupGuard(
        Cgroup::create(
            &layout,
            &CgroupConfig::default(),
            &name("v2"),
            &limits(None, None, None),
        )
        .unwrap(),
    );
    let leaf = Path::new(mount).join(name("v2"));
    assert_eq!(cgroup.leaf_paths(), vec![leaf.clone()]);
    let mut sleep = ChildGuard(Command::new("sleep").arg("30").spawn().unwrap());
    cgroup.add_pid(sleep.pid()).unwrap();
    assert_eq!(procs(&leaf), vec![sleep.pid()]);

    cgroup.freeze(true).unwrap();
    assert!(read(&leaf.join("cgroup.events")).contains("frozen 1"));
    cgroup.freeze(false).unwrap();
    assert!(read(&leaf.join("cgroup.events")).contains("frozen 0"));
    assert!(cgroup.stats().cpu_time_ns.is_some());

    cgroup.kill_all().unwrap();
    assert!(procs(&leaf).is_empty());
    assert_eq!(sleep.0.wait().unwrap().signal(), Some(libc::SIGKILL));
    cgroup.remove().unwrap();
    assert!(!leaf.exists());
}

/// kill_all without a freezer (signal loop, pidfds) on real processes that are not
/// children of the caller: the orphans a fork bomb leaves behind.
#[test]
fn root_kill_all_without_a_freezer() {
    require_root!("root_kill_all_without_a_freezer");
    let mountinfo: String = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| !(l.contains(" - cgroup ") && l.split(',').any(|o| o == "freezer")))
        .map(|l| format!("{l}\n"))
        .collect();
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    let layout = Layout::from_texts(&mountinfo, &own, Path::new("/")).unwrap();
    if layout.version() == CgroupVersion::V2 {
        println!(
            "skipping root_kill_all_without_a_freezer: pure v2 host (cgroup.kill or cgroup.freeze)"
        );
        return;
    }
    let cgroup = CgroupGuard(
        Cgroup::create(
            &layout,
            &CgroupConfig::default(),
            &name("nofreezer"),
            &limits(None, Some(16), None),
        )
        .unwrap(),
    );
    assert!(!cgroup
        .enforced()
        .controllers
        .contains_key(&Controller::Freezer));
    let mut shell = spawn_gated(
        "sh",
        &[
            "-c",
            "read go; for i in $(seq 10); do sleep 30 2>/dev/null & done",
        ],
    );
    cgroup.add_pid(shell.pid()).unwrap();
    shell.release();
    shell.0.wait().unwrap();
    let leaf = leaf_of(&cgroup, Controller::Pids);
    let orphans = procs(&leaf);
    assert_eq!(orphans.len(), 10, "{orphans:?}");
    cgroup.kill_all().unwrap();
    assert!(procs(&leaf).is_empty());
    for pid in orphans {
        // Reaped by init or a zombie at most: not running.
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        assert!(state.is_empty() || state.contains(") Z "), "{pid}: {state}");
    }
    cgroup.remove().unwrap();
    assert!(!leaf.exists());
}
