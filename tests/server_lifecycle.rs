//! Lifecycle guarantees of `brig serve`, tested against the real daemon: sessions
//! survive a daemon restart (SIGKILL or SIGTERM) and are re-attached (running or
//! paused, with their idle clocks), a SIGKILL in the middle of creates leaves no
//! sandbox untracked, sandboxes that died or expired while the daemon was down are
//! cleaned up at start, delete and the reaper end sessions promptly (running execs
//! included), the warm pool fills, serves and does not leak, snapshots fork and
//! restore, and `/v1/execute` works in the python image.
//!
//! Every test counts what it leaves: sandbox processes (by pid and start time),
//! cgroup leaves, mounts and loop devices under its own temporary directory, and
//! session directories.
//!
//! Process-wide state: the test process makes itself a child subreaper, so the inits
//! of sandboxes orphaned by a killed daemon come to it (this machine's PID 1 does not
//! reap) and are reaped here, by pid and start time only. Tests take [`serial`], so
//! the leak counts and timings of one are not disturbed by another (`cargo test` may
//! run them in parallel threads); the slow python test builds its image first.

mod common;

use std::collections::BTreeSet;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, MutexGuard, Once};
use std::time::{Duration, Instant};

use common::daemon::Daemon;
use common::is_root;
use serde_json::{json, Value};

// Setup ---------------------------------------------------------------------------

/// Serializes the tests of this file (see the module comment).
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Root (CI runs as root) and a child subreaper; false: skip the test.
fn setup() -> bool {
    if !is_root() {
        eprintln!("skipped: this test needs root");
        return false;
    }
    static SUBREAPER: Once = Once::new();
    SUBREAPER.call_once(|| {
        nix::sys::prctl::set_child_subreaper(true).expect("PR_SET_CHILD_SUBREAPER");
    });
    true
}

/// A data dir and store that outlive daemons (restarts), in one temporary directory.
/// Dropping it destroys every sandbox its database still knows (a failed test leaves
/// nothing running), unmounts the store's layers, and removes the directory.
struct Fixture {
    dir: tempfile::TempDir,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::Builder::new()
            .prefix("brig-lifecycle-test-")
            .tempdir()
            .expect("temp dir");
        Fixture { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn data_dir(&self) -> PathBuf {
        self.path().join("data")
    }

    fn store(&self) -> PathBuf {
        self.path().join("store")
    }

    fn start(&self, args: &[&str]) -> Daemon {
        Daemon::start_in(&self.data_dir(), &self.store(), args)
    }

    fn db(&self) -> rusqlite::Connection {
        let conn =
            rusqlite::Connection::open(self.data_dir().join("brig.db")).expect("open brig.db");
        conn.busy_timeout(Duration::from_secs(10)).unwrap();
        conn
    }

    /// Every sandbox the database has a record of (live or not).
    fn rows(&self) -> Vec<Row> {
        if !self.data_dir().join("brig.db").exists() {
            return Vec::new();
        }
        let conn = self.db();
        let mut stmt = conn
            .prepare("SELECT id, state, runtime FROM sessions WHERE runtime IS NOT NULL")
            .unwrap();
        let rows = stmt
            .query_map([], |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, String>(1)?,
                    row.get::<_, String>(2)?,
                ))
            })
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        rows.into_iter()
            .map(|(id, state, runtime)| {
                let runtime: Value = serde_json::from_str(&runtime).unwrap();
                Row {
                    id,
                    state,
                    init: Init::of(&runtime),
                    runtime,
                }
            })
            .collect()
    }

    /// The sandbox of session (or pool entry) `id`.
    fn init(&self, id: &str) -> Init {
        self.rows()
            .into_iter()
            .find(|r| r.id == id)
            .unwrap_or_else(|| panic!("no row for {id}"))
            .init
    }

    /// The state in the session's row; `None` once it has none (it ended).
    fn state_of(&self, id: &str) -> Option<String> {
        use rusqlite::OptionalExtension;
        self.db()
            .query_row("SELECT state FROM sessions WHERE id = ?1", [id], |row| {
                row.get(0)
            })
            .optional()
            .unwrap()
    }

    /// Entries of `<data-dir>/sessions/`.
    fn session_dirs(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.data_dir().join("sessions"))
            .map(|dir| {
                dir.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    }

    /// Mount points in this process's mount namespace that involve this fixture's
    /// directory (the host side of every sandbox here: layer mounts, binds).
    fn mounts(&self) -> BTreeSet<String> {
        let me = self.path().to_string_lossy().into_owned();
        std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .filter(|line| line.contains(&me))
            .map(String::from)
            .collect()
    }

    /// Loop devices backed by a file in this fixture's directory.
    fn loop_devices(&self) -> BTreeSet<String> {
        let me = self.path().to_string_lossy().into_owned();
        let mut found = BTreeSet::new();
        for entry in std::fs::read_dir("/sys/block").unwrap().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !name.starts_with("loop") {
                continue;
            }
            let backing =
                std::fs::read_to_string(entry.path().join("loop/backing_file")).unwrap_or_default();
            if backing.contains(&me) {
                found.insert(format!("{name}: {}", backing.trim()));
            }
        }
        found
    }

    /// `brig image ARGS --store STORE`.
    fn image(&self, args: &[&str]) -> std::process::Output {
        common::brig()
            .env_remove("BRIG_STORE")
            .arg("image")
            .args(args)
            .arg("--store")
            .arg(self.store())
            .stdin(std::process::Stdio::null())
            .output()
            .expect("start brig image")
    }
}

/// Unix socket paths a process has open (its agent socket, for a sandbox init).
fn socket_paths(pid: i32) -> Vec<String> {
    let inodes: BTreeSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter_map(|link| {
            let link = link.to_string_lossy().into_owned();
            Some(
                link.strip_prefix("socket:[")?
                    .strip_suffix(']')?
                    .to_string(),
            )
        })
        .collect();
    std::fs::read_to_string("/proc/net/unix")
        .unwrap_or_default()
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (inode, path) = (fields.get(6)?, fields.get(7)?);
            inodes.contains(*inode).then(|| path.to_string())
        })
        .collect()
}

impl Drop for Fixture {
    fn drop(&mut self) {
        // Sandboxes orphaned to this process that serve a socket in here but that no
        // row records (what a failed test about untracked sandboxes leaves).
        let me = self.path().to_string_lossy().into_owned();
        for pid in orphaned_inits(&[]) {
            if socket_paths(pid).iter().any(|p| p.starts_with(&me)) {
                eprintln!("fixture: destroying sandbox {pid}, left behind unrecorded");
                destroy_untracked(pid);
            }
        }
        // A failed test may have left sandboxes: end them (by pid and start time,
        // through brig's own handle) and remove their cgroups.
        for row in self.rows() {
            if let Ok(handle) = serde_json::from_value::<brig_jail::session::SessionHandle>(
                row.runtime["handle"].clone(),
            ) {
                if row.init.alive() || row.init.leaves.iter().any(|l| Path::new(l).exists()) {
                    eprintln!("fixture: destroying the sandbox of {} left behind", row.id);
                }
                let _ = handle.destroy();
            }
            row.init.reap();
        }
        if self.store().exists() {
            let out = self.image(&["gc", "--unmount"]);
            if !out.status.success() {
                eprintln!("fixture: gc --unmount: {out:?}");
            }
        }
        // Whatever is still mounted here would make removing the directory fail.
        let mut left: Vec<String> = self
            .mounts()
            .iter()
            .filter_map(|line| line.split(' ').nth(4).map(String::from))
            .collect();
        left.sort_by_key(|p| std::cmp::Reverse(p.len()));
        for mount in left {
            eprintln!("fixture: unmounting {mount} left by brig");
            let _ = Command::new("umount").arg("-l").arg(&mount).status();
        }
    }
}

struct Row {
    id: String,
    state: String,
    init: Init,
    runtime: Value,
}

/// A sandbox's init on the host, identified by pid and start time, and its cgroup
/// leaves.
#[derive(Debug, Clone)]
struct Init {
    pid: i32,
    start_time: u64,
    leaves: Vec<String>,
}

/// State, parent and start time of a process, from /proc/PID/stat.
fn proc_stat(pid: i32) -> Option<(char, i32, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    Some((
        fields.first()?.chars().next()?,
        fields.get(1)?.parse().ok()?,
        fields.get(19)?.parse().ok()?,
    ))
}

impl Init {
    /// From a session's `runtime` record.
    fn of(runtime: &Value) -> Init {
        Init {
            pid: runtime["handle"]["pid"].as_i64().expect("handle.pid") as i32,
            start_time: runtime["handle"]["start_time"]
                .as_u64()
                .expect("handle.start_time"),
            leaves: leaves_of(&runtime["enforced"]),
        }
    }

    /// This very process (not a recycled pid) exists, zombie or not.
    fn exists(&self) -> bool {
        proc_stat(self.pid).is_some_and(|(_, _, start)| start == self.start_time)
    }

    fn alive(&self) -> bool {
        proc_stat(self.pid)
            .is_some_and(|(state, _, start)| start == self.start_time && state != 'Z')
    }

    fn parent(&self) -> Option<i32> {
        proc_stat(self.pid)
            .filter(|(_, _, start)| *start == self.start_time)
            .map(|(_, ppid, _)| ppid)
    }

    /// Reaps it if it is a zombie child of this process (orphaned to us, the
    /// subreaper); never waits for another pid.
    fn reap(&self) {
        if let Some((state, ppid, start)) = proc_stat(self.pid) {
            if state == 'Z' && start == self.start_time && ppid == std::process::id() as i32 {
                let _ = nix::sys::wait::waitpid(
                    nix::unistd::Pid::from_raw(self.pid),
                    Some(nix::sys::wait::WaitPidFlag::WNOHANG),
                );
            }
        }
    }

    /// Waits until the process is gone (reaping it if it comes to us).
    fn gone_within(&self, ms: u64) -> bool {
        eventually(ms, || {
            self.reap();
            !self.exists()
        })
    }

    fn describe(&self) -> String {
        format!("pid {} ({:?})", self.pid, proc_stat(self.pid))
    }
}

/// `enforced.cgroup.details.leaves` of a session (or of its runtime record).
fn leaves_of(enforced: &Value) -> Vec<String> {
    enforced["cgroup"]["details"]["leaves"]
        .as_array()
        .map(|l| {
            l.iter()
                .filter_map(|p| p.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

fn eventually(ms: u64, mut check: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + Duration::from_millis(ms);
    loop {
        if check() {
            return true;
        }
        if Instant::now() > end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// Direct children of `pid` (all its threads).
fn children(pid: i32) -> Vec<i32> {
    let mut found = Vec::new();
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for task in tasks.flatten() {
            let list = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            found.extend(
                list.split_whitespace()
                    .filter_map(|c| c.parse::<i32>().ok()),
            );
        }
    }
    found
}

// API helpers ---------------------------------------------------------------------

fn create(d: &Daemon, key: &str, body: Value) -> Value {
    let (status, session) = d.request("POST", "/v1/sessions", Some(key), Some(body.clone()));
    assert_eq!(status, 201, "create {body}: {session}");
    session
}

fn id_of(session: &Value) -> String {
    session["session_id"]
        .as_str()
        .expect("session_id")
        .to_string()
}

/// Runs a shell line in a session; asserts it ran and exited 0; returns stdout.
#[track_caller]
fn sh(d: &Daemon, key: &str, id: &str, cmd: &str) -> String {
    let (status, result) = d.request(
        "POST",
        &format!("/v1/sessions/{id}/exec"),
        Some(key),
        Some(json!({ "cmd": cmd })),
    );
    assert_eq!(status, 200, "exec {cmd:?} in {id}: {result}");
    assert_eq!(result["exit_code"], 0, "exec {cmd:?} in {id}: {result}");
    result["stdout"].as_str().unwrap().to_string()
}

#[track_caller]
fn delete(d: &Daemon, key: &str, id: &str) {
    let (status, body) = d.request("DELETE", &format!("/v1/sessions/{id}"), Some(key), None);
    assert_eq!(status, 204, "delete {id}: {body}");
}

fn status_of(d: &Daemon, key: &str, id: &str) -> u16 {
    d.request("GET", &format!("/v1/sessions/{id}"), Some(key), None)
        .0
}

/// Session ids listed for `key` (listing does not count as activity).
/// (session, reason) of every `session.expire` event the reaper recorded.
fn expiry_reasons(d: &Daemon, key: &str) -> BTreeSet<(String, String)> {
    let (status, audit) = d.request("GET", "/v1/audit?action=session.expire", Some(key), None);
    assert_eq!(status, 200, "{audit}");
    audit["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let field = |v: &Value| v.as_str().unwrap_or_default().to_string();
            (field(&e["session_id"]), field(&e["detail"]["reason"]))
        })
        .collect()
}

fn listed(d: &Daemon, key: &str) -> BTreeSet<String> {
    let (status, list) = d.request("GET", "/v1/sessions", Some(key), None);
    assert_eq!(status, 200, "{list}");
    list["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(id_of)
        .collect()
}

fn process_output(d: &Daemon, key: &str, id: &str, process: u64) -> Vec<u8> {
    let (status, bytes) = d.raw(
        "GET",
        &format!("/v1/sessions/{id}/processes/{process}/output?stream=stdout"),
        Some(key),
        None,
        None,
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
    bytes
}

/// `brig_pool_ready{image="..."}` from /metrics.
fn pool_ready(d: &Daemon, image: &str) -> Option<u64> {
    let (status, text) = d.raw("GET", "/metrics", None, None, None);
    assert_eq!(status, 200);
    let prefix = format!("brig_pool_ready{{image=\"{image}\"}} ");
    String::from_utf8_lossy(&text)
        .lines()
        .find_map(|l| l.strip_prefix(&prefix).and_then(|v| v.trim().parse().ok()))
}

#[track_caller]
fn wait_pool(d: &Daemon, image: &str, n: u64) {
    assert!(
        eventually(60_000, || pool_ready(d, image) == Some(n)),
        "the {image} pool did not reach {n} (now {:?}); log:\n{}",
        pool_ready(d, image),
        d.log_text()
    );
}

/// After every session is deleted: no sandbox process, cgroup leaf, session
/// directory, mount or loop device of the fixture is left.
#[track_caller]
fn assert_nothing_left(fx: &Fixture, inits: &[Init], mounts_before: &BTreeSet<String>) {
    for init in inits {
        assert!(
            init.gone_within(10_000),
            "sandbox init still there: {}",
            init.describe()
        );
    }
    let leaves: Vec<&String> = inits.iter().flat_map(|i| &i.leaves).collect();
    assert!(!leaves.is_empty(), "as root, sandboxes have cgroups");
    let left: Vec<_> = leaves.iter().filter(|l| Path::new(l).exists()).collect();
    assert!(left.is_empty(), "cgroup leaves left: {left:?}");
    assert_eq!(fx.session_dirs(), Vec::<String>::new(), "session dirs left");
    // Ended sessions leave no rows either (their history is the audit log's).
    let rows: Vec<(String, String)> = fx
        .rows()
        .into_iter()
        .filter(|r| r.state != "pooled")
        .map(|r| (r.id, r.state))
        .collect();
    assert_eq!(rows, [], "session rows left");
    if fx.data_dir().join("brig.db").exists() {
        let processes: i64 = fx
            .db()
            .query_row("SELECT COUNT(*) FROM processes", [], |row| row.get(0))
            .unwrap();
        assert_eq!(processes, 0, "rows of background processes left");
    }
    let mounts: Vec<_> = fx.mounts().difference(mounts_before).cloned().collect();
    assert!(mounts.is_empty(), "mounts left: {mounts:#?}");
    assert_eq!(fx.loop_devices(), BTreeSet::new(), "loop devices left");
}

// 1. Restart after SIGKILL --------------------------------------------------------

/// A POST that must not hang: the status, or the transport error as text.
fn post_exec(url: &str, key: &str, cmd: &str) -> Result<(u16, String), String> {
    post_exec_timeout(url, key, cmd, 30_000)
}

fn post_exec_timeout(
    url: &str,
    key: &str,
    cmd: &str,
    timeout_ms: u64,
) -> Result<(u16, String), String> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_millis(timeout_ms + 30_000)))
        .build()
        .into();
    let body = serde_json::to_vec(&json!({ "cmd": cmd, "timeout_ms": timeout_ms })).unwrap();
    let response = agent
        .post(url)
        .header("Authorization", format!("Bearer {key}"))
        .content_type("application/json")
        .send(&body[..])
        .map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let mut text = String::new();
    response
        .into_body()
        .into_reader()
        .read_to_string(&mut text)
        .map_err(|e| e.to_string())?;
    Ok((status, text))
}

#[test]
fn restart_after_sigkill_reattaches_every_session_and_delete_leaves_nothing() {
    if !setup() {
        return;
    }
    let _serial = serial();
    let fx = Fixture::new();
    let mounts_before = fx.mounts();
    let mut d = fx.start(&[]);
    let key = d.admin_key().to_string();

    let ids: Vec<String> = (0..3)
        .map(|_| id_of(&create(&d, &key, json!({}))))
        .collect();
    for id in &ids {
        sh(&d, &key, id, &format!("echo {id} > mark"));
    }
    let (status, process) = d.request(
        "POST",
        &format!("/v1/sessions/{}/processes", ids[0]),
        Some(&key),
        Some(json!({"cmd": "i=0; while :; do echo $i; i=$((i+1)); sleep 0.1; done"})),
    );
    assert_eq!(status, 201, "{process}");
    let process_id = process["process_id"].as_u64().unwrap();
    let inits: Vec<Init> = ids.iter().map(|id| fx.init(id)).collect();
    let daemon_children = d.descendants();
    for init in &inits {
        assert!(init.alive(), "{}", init.describe());
        assert!(
            daemon_children.contains(&(init.pid as u32)),
            "init {} is not the daemon's child: {daemon_children:?}",
            init.pid
        );
    }

    // Ten execs in flight, then SIGKILL: each fails cleanly and promptly.
    let children_now = || inits.iter().map(|i| children(i.pid).len()).sum::<usize>();
    let baseline = children_now();
    let (tx, rx) = std::sync::mpsc::channel();
    for n in 0..10 {
        let url = d.url(&format!("/v1/sessions/{}/exec", ids[n % 3]));
        let (key, tx) = (key.clone(), tx.clone());
        std::thread::spawn(move || {
            let _ = tx.send(post_exec(&url, &key, "sleep 600; echo late"));
        });
    }
    drop(tx);
    assert!(
        eventually(60_000, || children_now() >= baseline + 10),
        "the ten execs did not start: {} processes",
        children_now() - baseline
    );
    d.kill9();
    let killed_at = Instant::now();
    for _ in 0..10 {
        let result = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("an exec request hung after the daemon was killed");
        assert!(
            result.is_err(),
            "an exec in flight got an answer from a killed daemon: {result:?}"
        );
    }
    eprintln!(
        "in-flight execs failed {} ms after SIGKILL",
        killed_at.elapsed().as_millis()
    );
    // Their commands end with the daemon's connections (init kills an exec whose
    // requester is gone), well before their 600 s sleeps would; the background
    // process runs on (checked below).
    let left = (|| {
        while killed_at.elapsed() < Duration::from_secs(60) {
            if children_now() == baseline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        Some(children_now() - baseline)
    })();
    assert_eq!(left, None, "in-flight execs' commands outlived the daemon");
    // The sandboxes live on, orphaned to us (the subreaper).
    for init in &inits {
        assert!(
            init.alive(),
            "a sandbox died with the daemon: {}",
            init.describe()
        );
        assert_eq!(init.parent(), Some(std::process::id() as i32));
    }
    std::thread::sleep(Duration::from_millis(500));

    let d2 = fx.start(&[]);
    assert_eq!(
        listed(&d2, &key),
        ids.iter().cloned().collect::<BTreeSet<_>>()
    );
    for id in &ids {
        assert_eq!(sh(&d2, &key, id, "cat mark"), format!("{id}\n"));
    }
    // The background process kept running through the restart.
    let (status, info) = d2.request(
        "GET",
        &format!("/v1/sessions/{}/processes/{process_id}", ids[0]),
        Some(&key),
        None,
    );
    assert_eq!(status, 200, "{info}");
    assert_eq!(info["state"], "running", "{info}");
    let before = process_output(&d2, &key, &ids[0], process_id);
    assert!(
        eventually(60_000, || process_output(&d2, &key, &ids[0], process_id)
            .len()
            > before.len()),
        "the background process's output stopped growing"
    );
    let text = String::from_utf8(process_output(&d2, &key, &ids[0], process_id)).unwrap();
    let numbers: Vec<u64> = text.lines().map(|l| l.parse().unwrap()).collect();
    assert!(
        numbers.iter().enumerate().all(|(i, n)| *n == i as u64),
        "the counter skipped: {text}"
    );
    // The same sandboxes: same inits, nothing started again.
    for (id, init) in ids.iter().zip(&inits) {
        let now = fx.init(id);
        assert_eq!((now.pid, now.start_time), (init.pid, init.start_time));
        assert!(init.alive(), "{}", init.describe());
    }
    assert_eq!(
        d2.descendants(),
        Vec::<u32>::new(),
        "re-attaching launched something"
    );

    for id in &ids {
        delete(&d2, &key, id);
    }
    assert_eq!(listed(&d2, &key), BTreeSet::new());
    assert_nothing_left(&fx, &inits, &mounts_before);
}

// 1b. The launch zygote -----------------------------------------------------------

/// The daemon's launch zygote (`brig_jail::zygote`), found among its children.
fn zygote_of(d: &Daemon) -> Init {
    let pid = children(d.pid() as i32)
        .into_iter()
        .find(|p| common::daemon::is_zygote(*p as u32) && !common::daemon::is_zombie(*p as u32))
        .expect("the daemon has no launch zygote after a launch");
    let (_, _, start_time) = proc_stat(pid).expect("the zygote's stat");
    Init {
        pid,
        start_time,
        leaves: Vec::new(),
    }
}

#[test]
fn the_launch_zygote_ends_with_its_daemon_stopped_or_killed_and_sandboxes_live_on() {
    if !setup() {
        return;
    }
    let _serial = serial();
    let fx = Fixture::new();
    let mounts_before = fx.mounts();
    let mut d = fx.start(&[]);
    let key = d.admin_key().to_string();
    let first = id_of(&create(&d, &key, json!({})));
    let zygote = zygote_of(&d);
    d.stop();
    assert!(
        zygote.gone_within(30_000),
        "the zygote outlived a stopped daemon: {}",
        zygote.describe()
    );
    let mut d2 = fx.start(&[]);
    let second = id_of(&create(&d2, &key, json!({})));
    let inits = [fx.init(&first), fx.init(&second)];
    let zygote = zygote_of(&d2);
    d2.kill9();
    assert!(
        zygote.gone_within(30_000),
        "the zygote outlived a killed daemon: {}",
        zygote.describe()
    );
    for init in &inits {
        assert!(
            init.alive(),
            "a sandbox ended with the zygote: {}",
            init.describe()
        );
    }
    let d3 = fx.start(&[]);
    for id in [&first, &second] {
        assert_eq!(sh(&d3, &key, id, "echo alive"), "alive\n");
        delete(&d3, &key, id);
    }
    assert_nothing_left(&fx, &inits, &mounts_before);
}

#[test]
fn a_launch_zygote_that_died_is_started_again_by_the_next_launch() {
    if !setup() {
        return;
    }
    let _serial = serial();
    let fx = Fixture::new();
    let mounts_before = fx.mounts();
    let d = fx.start(&[]);
    let key = d.admin_key().to_string();
    let first = id_of(&create(&d, &key, json!({})));
    let killed = zygote_of(&d);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(killed.pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    assert!(
        eventually(30_000, || proc_stat(killed.pid)
            .is_none_or(|(state, _, _)| state == 'Z')),
        "SIGKILL did not end the zygote"
    );
    let second = id_of(&create(&d, &key, json!({})));
    assert_eq!(sh(&d, &key, &second, "echo started"), "started\n");
    let again = zygote_of(&d);
    assert_ne!(
        (again.pid, again.start_time),
        (killed.pid, killed.start_time)
    );
    let inits = [fx.init(&first), fx.init(&second)];
    for id in [&first, &second] {
        delete(&d, &key, id);
    }
    assert_nothing_left(&fx, &inits, &mounts_before);
}

// 2. Restart after SIGTERM --------------------------------------------------------

#[test]
fn sigterm_is_not_a_teardown_sessions_survive_a_graceful_restart() {
    if !setup() {
        return;
    }
    let _serial = serial();
    let fx = Fixture::new();
    let mounts_before = fx.mounts();
    let mut d = fx.start(&[]);
    let key = d.admin_key().to_string();
    let ids: Vec<String> = (0..2)
        .map(|i| id_of(&create(&d, &key, json!({"metadata": {"n": i.to_string()}}))))
        .collect();
    for id in &ids {
        sh(&d, &key, id, &format!("echo {id} > /tmp/mark"));
    }
    let inits: Vec<Init> = ids.iter().map(|id| fx.init(id)).collect();

    // An exec in flight when SIGTERM arrives finishes (graceful), then the daemon
    // exits without touching the sandboxes.
    let url = d.url(&format!("/v1/sessions/{}/exec", ids[0]));
    let key2 = key.clone();
    let in_flight = std::thread::spawn(move || post_exec(&url, &key2, "sleep 1; echo finished"));
    assert!(
        eventually(60_000, || !children(inits[0].pid).is_empty()),
        "the exec did not start"
    );
    let stopping = Instant::now();
    d.stop();
    eprintln!("SIGTERM: stopped in {} ms", stopping.elapsed().as_millis());
    let (status, body) = in_flight
        .join()
        .unwrap()
        .expect("the exec in flight was cut");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("finished"), "{body}");
    for (id, init) in ids.iter().zip(&inits) {
        assert!(init.alive(), "SIGTERM ended a sandbox: {}", init.describe());
        assert_eq!(fx.state_of(id).as_deref(), Some("running"));
    }

    let d2 = fx.start(&[]);
    assert_eq!(
        listed(&d2, &key),
        ids.iter().cloned().collect::<BTreeSet<_>>()
    );
    // Metadata is the session's: the next daemon returns it and finds by it.
    let (status, found) = d2.request("GET", "/v1/sessions?metadata=n%3D1", Some(&key), None);
    assert_eq!(status, 200, "{found}");
    let found: Vec<&Value> = found["sessions"].as_array().unwrap().iter().collect();
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0]["session_id"], ids[1].as_str());
    assert_eq!(found[0]["metadata"], json!({"n": "1"}));
    for id in &ids {
        assert_eq!(sh(&d2, &key, id, "cat /tmp/mark"), format!("{id}\n"));
        delete(&d2, &key, id);
    }
    assert_nothing_left(&fx, &inits, &mounts_before);
}

// 2b. Activity, pauses and deletes across restarts ---------------------------------

#[test]
fn background_processes_are_watched_and_counted_again_after_a_restart() {
    if !setup() {
        return;
    }
    let _serial = serial();
    let fx = Fixture::new();
    let args = ["--tenant-max-processes", "1"];
    let mut d = fx.start(&args);
    let key = d.admin_key().to_string();
    let id = id_of(&create(&d, &key, json!({})));
    let start = |d: &Daemon, cmd: &str| {
        d.request(
            "POST",
            &format!("/v1/sessions/{id}/processes"),
            Some(&key),
            Some(json!({ "cmd": cmd })),
        )
    };
    let (status, process) = start(&d, "sleep 1000");
    assert_eq!(status, 201, "{process}");
    let pid = process["process_id"].as_u64().unwrap();
    d.stop();

    let d2 = fx.start(&args);
    // Still running, so still counted: the tenant's one process is taken.
    let counted = eventually(60_000, || start(&d2, "true").0 == 429);
    assert!(
        counted,
        "a process the previous daemon started is not counted"
    );
    let (status, _) = d2.request(
        "POST",
        &format!("/v1/sessions/{id}/processes/{pid}/signal"),
        Some(&key),
        Some(json!({"signal": "KILL"})),
    );
    assert_eq!(status, 204);
    // Its end is recorded without anyone waiting for it, and its place is free.
    let state = || {
        let (_, info) = d2.request(
            "GET",
            &format!("/v1/sessions/{id}/processes/{pid}"),
            Some(&key),
            None,
        );
        info
    };
    assert!(
        eventually(60_000, || state()["state"] == "exited"),
        "{}",
        state()
    );
    assert_eq!(state()["signal"], 9, "{}", state());
    assert!(eventually(60_000, || start(&d2, "true").0 == 201));
    delete(&d2, &key, &id);
}

#[test]
fn a_session_in_use_is_not_idle_reaped_by_a_restarted_daemon() {
    if !setup() {
        return;
    }
    let _serial = serial();
    let fx = Fixture::new();
    let mounts_before = fx.mounts();
    let mut d = fx.start(&[]);
    let key = d.admin_key().to_string();
    // Its idle timeout is 10x what the kill and the restart below take: the next
    // daemon starts well within it of the last use.
    let id = id_of(&create(&d, &key, json!({"idle_timeout_seconds": 10})));
    let init = fx.init(&id);
    // In use for longer than its idle timeout, up to the moment the daemon dies.
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(11) {
        sh(&d, &key, &id, "true");
        std::thread::sleep(Duration::from_millis(300));
    }
    d.kill9();
    let d2 = fx.start(&[]);
    assert_eq!(
        status_of(&d2, &key, &id),
        200,
        "a session used a moment ago was reaped as idle at start; log:\n{}",
        d2.log_text()
    );
    assert!(init.alive());
    // Its idle clock still runs: left alone, it goes.
    assert!(
        eventually(60_000, || !listed(&d2, &key).contains(&id)),
        "the session was never reaped as idle"
    );
    assert_nothing_left(&fx, &[init], &mounts_before);
}

/// The scheduling policy of `pid` (/proc/PID/sched).
fn sched_policy(pid: i32) -> i32 {
    std::fs::read_to_string(format!("/proc/{pid}/sched"))
        .unwrap()
        .lines()
        .find_map(|l| {
            l.strip_prefix("policy")?
                .split(':')
                .nth(1)?
                .trim()
                .parse()
                .ok()
        })
        .expect("a policy line")
}

/// Inodes with a shared flock on them (/proc/locks), once per lock.
fn read_locked_inodes() -> Vec<u64> {
    std::fs::read_to_string("/proc/locks")
        .unwrap()
        .lines()
        .filter(|l| l.contains("FLOCK") && l.contains("READ"))
        .filter_map(|l| {
            l.split_whitespace()
                .nth(5)?
                .rsplit(':')
                .next()?
                .parse()
                .ok()
        })
        .collect()
}

/// A session binds the host's cached /etc tree (brig-jail's `etccache`): its init,
/// not the helper that started it, holds the lock that keeps eviction off the tree,
/// from creation (across a daemon restart) until the session is deleted.
#[test]
fn a_session_holds_its_etc_tree_until_it_is_deleted() {
    if !setup() {
        return;
    }
    use std::os::unix::fs::MetadataExt;
    let _serial = serial();
    let fx = Fixture::new();
    let mounts_before = fx.mounts();
    let mut d = fx.start(&[]);
    let key = d.admin_key().to_string();
    let id = id_of(&create(&d, &key, json!({})));
    let init = fx.init(&id);
    let cache = Path::new(brig_jail::ETC_CACHE_DIR);
    let held: Vec<u64> = std::fs::read_dir(format!("/proc/{}/fd", init.pid))
        .unwrap()
        .filter_map(|fd| std::fs::read_link(fd.unwrap().path()).ok())
        .filter(|target| target.starts_with(cache))
        .map(|target| std::fs::metadata(target).unwrap().ino())
        .collect();
    assert_eq!(
        held.len(),
        1,
        "the init holds no /etc tree of {}",
        cache.display()
    );
    assert!(read_locked_inodes().contains(&held[0]));
    d.kill9();
    let d2 = fx.start(&[]);
    assert!(sh(&d2, &key, &id, "cat /etc/hostname").contains('\n'));
    // Other sessions on this host (of other daemons) may hold the same tree.
    let locks = || {
        read_locked_inodes()
            .iter()
            .filter(|i| **i == held[0])
            .count()
    };
    let before = locks();
    assert!(before >= 1);
    delete(&d2, &key, &id);
    assert_nothing_left(&fx, &[init], &mounts_before);
    assert_eq!(
        locks(),
        before - 1,
        "the deleted session's lock is still held"
    );
}

#[test]
fn a_paused_session_stays_paused_across_a_restart_and_is_deleted_promptly() {
    if !setup() {
        return;
    }
    let _serial = serial();
    let fx = Fixture::new();
    let mounts_before = fx.mounts();
    let mut d = fx.start(&[]);
    let key = d.admin_key().to_string();
    let paused = id_of(&create(&d, &key, json!({})));
    let resumed = id_of(&create(&d, &key, json!({})));
    let inits = [fx.init(&paused), fx.init(&resumed)];
    for id in [&paused, &resumed] {
        sh(&d, &key, id, "echo kept > /tmp/f");
        let (status, s) = d.request(
            "POST",
            &format!("/v1/sessions/{id}/pause"),
            Some(&key),
            None,
        );
        assert_eq!((status, s["state"].as_str()), (200, Some("paused")), "{s}");
    }
    d.kill9();
    let d2 = fx.start(&[]);
    for id in [&paused, &resumed] {
        let (status, s) = d2.request("GET", &format!("/v1/sessions/{id}"), Some(&key), None);
        assert_eq!((status, s["state"].as_str()), (200, Some("paused")), "{s}");
        let (status, e) = d2.request(
            "POST",
            &format!("/v1/sessions/{id}/exec"),
            Some(&key),
            Some(json!({"cmd": "true"})),
        );
        assert_eq!(status, 409, "exec in a paused session: {e}");
    }
    let (status, s) = d2.request(
        "POST",
        &format!("/v1/sessions/{resumed}/resume"),
        Some(&key),
        None,
    );
    assert_eq!((status, s["state"].as_str()), (200, Some("running")), "{s}");
    assert_eq!(sh(&d2, &key, &resumed, "cat /tmp/f"), "kept\n");

    // Deleting a paused (frozen) session does not wait for anything.
    let started = Instant::now();
    delete(&d2, &key, &paused);
    let took = started.elapsed();
    assert!(
        inits[0].gone_within(5_000),
        "paused sandbox left: {}",
        inits[0].describe()
    );
    eprintln!("deleted a paused session in {} ms", took.as_millis());
    assert!(
        took < Duration::from_secs(2),
        "deleting a paused session took {took:?}"
    );
    delete(&d2, &key, &resumed);
    assert_nothing_left(&fx, &inits, &mounts_before);
}

#[test]
fn delete_and_expiry_end_running_execs_instead_of_waiting_for_them() {
    if !setup() {
        return;
    }
    let _serial = serial();
    let fx = Fixture::new();
    let mounts_before = fx.mounts();
    let d = fx.start(&["--max-execute-timeout", "5m"]);
    let key = d.admin_key().to_string();
    let deleted = id_of(&create(&d, &key, json!({})));
    let expiring = id_of(&create(&d, &key, json!({"ttl_seconds": 2})));
    let other = id_of(&create(&d, &key, json!({"ttl_seconds": 3})));
    let inits = [fx.init(&deleted), fx.init(&expiring), fx.init(&other)];
    let long_exec = |id: &str| {
        let url = d.url(&format!("/v1/sessions/{id}/exec"));
        let key = key.clone();
        std::thread::spawn(move || {
            let started = Instant::now();
            let result = post_exec_timeout(&url, &key, "sleep 120", 200_000);
            (result, started.elapsed())
        })
    };
    let in_deleted = long_exec(&deleted);
    let in_expiring = long_exec(&expiring);
    assert!(
        eventually(10_000, || !children(inits[0].pid).is_empty()
            && !children(inits[1].pid).is_empty()),
        "the execs did not start"
    );

    let started = Instant::now();
    delete(&d, &key, &deleted);
    let took = started.elapsed();
    eprintln!("DELETE with an exec running took {} ms", took.as_millis());
    // The exec would run 120 s: any bound well under that tells, however loaded
    // the machine.
    assert!(
        took < Duration::from_secs(60),
        "DELETE waited for the exec: {took:?}"
    );
    let (result, after) = in_deleted.join().unwrap();
    let (status, body) = result.expect("the exec request failed at the transport level");
    assert_ne!(status, 200, "{body}");
    assert!(after < Duration::from_secs(60), "{after:?}");

    // The TTL is a hard limit: a running exec does not keep the session alive, and
    // reaping it does not hold up the other sessions' expiry.
    let (result, after) = in_expiring.join().unwrap();
    let (status, body) = result.expect("the exec request failed at the transport level");
    assert_ne!(status, 200, "{body}");
    assert!(
        after < Duration::from_secs(60),
        "the expired session lived {after:?}"
    );
    assert!(
        eventually(60_000, || listed(&d, &key).is_empty()),
        "sessions left: {:?}",
        listed(&d, &key)
    );
    assert_nothing_left(&fx, &inits, &mounts_before);
}

/// Live sandbox inits that were orphaned to this process (the subreaper) and are
/// not known to `known`: sandboxes nobody tracks any more.
fn orphaned_inits(known: &[Init]) -> Vec<i32> {
    children(std::process::id() as i32)
        .into_iter()
        .filter(|pid| {
            // `brig_jail` names a session's init so.
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|comm| comm.trim() == "brig-init")
                && proc_stat(*pid).is_some_and(|(state, _, _)| state != 'Z')
                && !known.iter().any(|k| k.pid == *pid && k.alive())
        })
        .collect()
}

/// Kills a sandbox init orphaned to this process, reaps it and removes its cgroup
/// leaves (read from /proc/PID/cgroup: no record of it is left anywhere else).
fn destroy_untracked(pid: i32) {
    let leaves: Vec<String> = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            let controller = controllers.split(',').next()?;
            (path.contains("brig-") && !controller.is_empty())
                .then(|| format!("/sys/fs/cgroup/{controller}{path}"))
        })
        .collect();
    // A live child of this process: the pid cannot be another's until reaped.
    let pid = nix::unistd::Pid::from_raw(pid);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
    let _ = nix::sys::wait::waitpid(pid, None);
    for leaf in leaves {
        let _ = std::fs::remove_dir(&leaf);
    }
}

#[test]
fn sigkill_during_creates_leaves_no_untracked_sandbox() {
    if !setup() {
        return;
    }
    let _serial = serial();
    let fx = Fixture::new();
    let mounts_before = fx.mounts();
    let before = orphaned_inits(&[]);
    let roomy = [
        "--tenant-max-disk",
        "1000G",
        "--tenant-max-sessions",
        "1000",
    ];
    let mut refused = None;
    for round in 0..8 {
        let mut d = fx.start(&roomy);
        let key = d.admin_key().to_string();
        let url = d.url("/v1/sessions");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let creator = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let agent: ureq::Agent = ureq::Agent::config_builder()
                    .http_status_as_error(false)
                    .timeout_global(Some(Duration::from_secs(30)))
                    .build()
                    .into();
                let mut created = 0;
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    let sent = agent
                        .post(&url)
                        .header("Authorization", format!("Bearer {key}"))
                        .content_type("application/json")
                        .send(&b"{}"[..]);
                    match sent {
                        Ok(r) if r.status() == 201 => created += 1,
                        Ok(r) if !stop.load(std::sync::atomic::Ordering::SeqCst) => {
                            let status = r.status();
                            let body = r.into_body().read_to_string().unwrap_or_default();
                            return Err(format!("create: {status} {body}"));
                        }
                        _ => break,
                    }
                }
                Ok(created)
            })
        };
        std::thread::sleep(Duration::from_millis(150 + 37 * round));
        d.kill9();
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let created = match creator.join().unwrap() {
            Ok(n) => n,
            Err(e) => {
                refused = Some(e);
                break;
            }
        };
        eprintln!("round {round}: {created} sessions created before SIGKILL");
    }
    // Every sandbox the killed daemons stored (an ended session leaves no row, so
    // after the deletes below the rows would not name them).
    let every: Vec<Init> = fx.rows().into_iter().map(|r| r.init).collect();
    let d = fx.start(&roomy);
    let key = d.admin_key().to_string();
    let live = listed(&d, &key);
    let known: Vec<Init> = live.iter().map(|id| fx.init(id)).collect();
    let untracked: Vec<i32> = orphaned_inits(&known)
        .into_iter()
        .filter(|p| !before.contains(p))
        .collect();
    for pid in &untracked {
        destroy_untracked(*pid);
    }
    assert_eq!(refused, None, "a create was refused");
    let log = d.log_text();
    eprintln!(
        "sandboxes found only through their launch records: {}",
        log.matches("never stored").count()
    );
    assert!(
        untracked.is_empty(),
        "sandboxes running that no session or pool row knows: {untracked:?}"
    );
    for id in &live {
        delete(&d, &key, id);
    }
    assert_nothing_left(&fx, &every, &mounts_before);
}

/// A create answered 201 is durable, with its audit event: SIGKILLs in the middle of
/// creates (from the warm pool and cold) lose none of those the client was told
/// about. The create path writes its rows on the request's thread and its event in
/// the same transaction; this catches a change that acknowledges first and writes
/// later (a queue, a deferred flush).
#[test]
fn acknowledged_creates_and_their_audit_events_survive_sigkill() {
    if !setup() {
        return;
    }
    let _serial = serial();
    let fx = Fixture::new();
    let mounts_before = fx.mounts();
    let roomy = [
        "--tenant-max-disk",
        "1000G",
        "--tenant-max-sessions",
        "1000",
    ];
    let pooled_args = [&roomy[..], &["--pool", "host=2"]].concat();
    let mut acknowledged = BTreeSet::new();
    let mut pooled = 0;
    for round in 0..4 {
        let mut d = fx.start(&pooled_args);
        let key = d.admin_key().to_string();
        wait_pool(&d, "host", 2);
        let url = d.url("/v1/sessions");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let creator = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let agent: ureq::Agent = ureq::Agent::config_builder()
                    .http_status_as_error(false)
                    .timeout_global(Some(Duration::from_secs(30)))
                    .build()
                    .into();
                let mut created = Vec::new();
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    let sent = agent
                        .post(&url)
                        .header("Authorization", format!("Bearer {key}"))
                        .content_type("application/json")
                        .send(&b"{}"[..]);
                    let Ok(response) = sent else { break };
                    let status = response.status();
                    let Ok(body) = response.into_body().read_to_string() else {
                        break;
                    };
                    assert_eq!(status, 201, "create: {body}");
                    let session: Value = serde_json::from_str(&body).unwrap();
                    created.push((id_of(&session), session["pooled"] == true));
                }
                created
            })
        };
        std::thread::sleep(Duration::from_millis(60 + 29 * round));
        d.kill9();
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let created = creator.join().unwrap();
        eprintln!(
            "round {round}: {} creates acknowledged before SIGKILL",
            created.len()
        );
        pooled += created.iter().filter(|(_, p)| *p).count();
        acknowledged.extend(created.into_iter().map(|(id, _)| id));
    }
    assert!(pooled > 0, "no create was served from the pool");
    // Every sandbox the killed daemons stored (an ended session leaves no row, so
    // after the deletes below the rows would not name them).
    let every: Vec<Init> = fx.rows().into_iter().map(|r| r.init).collect();
    let d = fx.start(&roomy);
    let key = d.admin_key().to_string();
    let live = listed(&d, &key);
    let lost: Vec<_> = acknowledged.difference(&live).collect();
    assert!(lost.is_empty(), "acknowledged creates lost: {lost:?}");
    let (status, events) = d.request(
        "GET",
        "/v1/audit?action=session.create&outcome=ok&limit=1000",
        Some(&key),
        None,
    );
    assert_eq!(status, 200, "{events}");
    let audited: BTreeSet<String> = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["session_id"].as_str().map(str::to_string))
        .collect();
    let unaudited: Vec<_> = acknowledged.difference(&audited).collect();
    assert!(
        unaudited.is_empty(),
        "acknowledged creates without their audit event: {unaudited:?}"
    );
    for id in acknowledged.iter().take(3) {
        assert_eq!(sh(&d, &key, id, "echo ok"), "ok\n");
    }
    for id in &live {
        delete(&d, &key, id);
    }
    assert_nothing_left(&fx, &every, &mounts_before);
}

/// Freezes (or thaws) a sandbox's cgroup directly, as the daemon does for a pause or
/// a snapshot (v1 freezer or v2 cgroup.freeze, whichever the leaves have).
fn set_frozen(init: &Init, frozen: bool) {
    for leaf in &init.leaves {
        let v1 = Path::new(leaf).join("freezer.state");
        let v2 = Path::new(leaf).join("cgroup.freeze");
        if v1.exists() {
            std::fs::write(&v1, if frozen { "FROZEN" } else { "THAWED" }).unwrap();
            return;
        }
        if v2.exists() {
            std::fs::write(&v2, if frozen { "1" } else { "0" }).unwrap();
            return;
        }
    }
    panic!("no freezer among {:?}", init.leaves);
}

#[test]
fn a_session_left_frozen_by_a_daemon_killed_mid_snapshot_is_thawed_at_start() {
    if !setup() {
        return;
    }
    let _serial = serial();
    let fx = Fixture::new();
    let mounts_before = fx.mounts();
    let mut d = fx.start(&[]);
    let key = d.admin_key().to_string();
    let id = id_of(&create(&d, &key, json!({})));
    let init = fx.init(&id);
    // What a snapshot does for a moment: the session is frozen, its row says running.
    d.kill9();
    set_frozen(&init, true);
    let d2 = fx.start(&[]);
    let url = d2.url(&format!("/v1/sessions/{id}/exec"));
    let started = Instant::now();
    let result = post_exec_timeout(&url, &key, "echo thawed", 5_000);
    assert_eq!(
        result,
        Ok((200, result.clone().map(|r| r.1).unwrap_or_default())),
        "exec in a session whose row says running after {:?}",
        started.elapsed()
    );
    assert!(result.unwrap().1.contains("thawed"));
    delete(&d2, &key, &id);
    assert_nothing_left(&fx, &[init], &mounts_before);
}

// 3. Cleanup at start --------------------------------------------------------------

#[test]
fn sessions_that_died_or_expired_while_the_daemon_was_down_are_cleaned_up_at_start() {
    if !setup() {
        return;
    }
    let _serial = serial();
    let fx = Fixture::new();
    let mounts_before = fx.mounts();
    let mut d = fx.start(&[]);
    let key = d.admin_key().to_string();
    let dead = id_of(&create(&d, &key, json!({})));
    let kept = id_of(&create(&d, &key, json!({})));
    let expiring = id_of(&create(&d, &key, json!({"ttl_seconds": 2})));
    let created = Instant::now();
    d.stop();
    assert_eq!(
        fx.state_of(&expiring).as_deref(),
        Some("running"),
        "the daemon took too long to stop: the session expired while it ran"
    );
    let (dead_init, kept_init, expiring_init) =
        (fx.init(&dead), fx.init(&kept), fx.init(&expiring));

    // The sandbox of `dead` dies while no daemon runs; its cgroup stays behind.
    assert!(dead_init.alive());
    // A pid whose start time was just checked (alive above).
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(dead_init.pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill the dead session's init");
    assert!(dead_init.gone_within(10_000), "{}", dead_init.describe());
    assert!(dead_init.leaves.iter().all(|l| Path::new(l).exists()));
    // Down for more than the TTL of `expiring`.
    std::thread::sleep(Duration::from_millis(3200).saturating_sub(created.elapsed()));

    let d2 = fx.start(&[]);
    assert_eq!(status_of(&d2, &key, &dead), 404);
    assert_eq!(status_of(&d2, &key, &expiring), 404);
    assert_eq!(status_of(&d2, &key, &kept), 200);
    assert_eq!(listed(&d2, &key), BTreeSet::from([kept.clone()]));
    for (id, init) in [(&dead, &dead_init), (&expiring, &expiring_init)] {
        assert!(init.gone_within(10_000), "{id}: {}", init.describe());
        let left: Vec<_> = init
            .leaves
            .iter()
            .filter(|l| Path::new(l).exists())
            .collect();
        assert!(left.is_empty(), "{id}: cgroup leaves left: {left:?}");
        assert_eq!(fx.state_of(id), None, "{id}: its row is left");
    }
    assert_eq!(fx.session_dirs(), vec![kept.clone()]);
    assert!(kept_init.alive());
    sh(&d2, &key, &kept, "true");
    delete(&d2, &key, &kept);
    assert_nothing_left(&fx, &[dead_init, kept_init, expiring_init], &mounts_before);
}

// 4. The reaper --------------------------------------------------------------------

#[test]
fn reaper_ends_expired_and_idle_sessions_but_not_busy_ones() {
    if !setup() {
        return;
    }
    let _serial = serial();
    let fx = Fixture::new();
    let mounts_before = fx.mounts();
    let d = fx.start(&[]);
    let key = d.admin_key().to_string();

    let ttl = id_of(&create(&d, &key, json!({"ttl_seconds": 2})));
    let ttl_created = Instant::now();
    let idle = id_of(&create(&d, &key, json!({"idle_timeout_seconds": 2})));
    let idle_created = Instant::now();
    let busy = id_of(&create(&d, &key, json!({"idle_timeout_seconds": 2})));
    let inits: Vec<Init> = [&ttl, &idle, &busy].iter().map(|id| fx.init(id)).collect();

    // `busy` gets a request every fifth of a second; the others none (listing is
    // not activity), until both are reaped. Everything is checked through the
    // listing.
    let mut ttl_gone = None;
    let mut idle_gone = None;
    let started = Instant::now();
    while (ttl_gone.is_none() || idle_gone.is_none()) && started.elapsed() < Duration::from_secs(60)
    {
        sh(&d, &key, &busy, "true");
        let live = listed(&d, &key);
        if ttl_gone.is_none() && !live.contains(&ttl) {
            ttl_gone = Some(ttl_created.elapsed());
        }
        if idle_gone.is_none() && !live.contains(&idle) {
            idle_gone = Some(idle_created.elapsed());
        }
        assert!(live.contains(&busy), "a busy session was reaped as idle");
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!("reaped: ttl 2 s after {ttl_gone:?}, idle 2 s after {idle_gone:?}");
    let ttl_gone = ttl_gone.expect("the session with ttl_seconds 2 lived 60 s");
    // Expiry is in whole seconds: at least one second after the request's second.
    assert!(ttl_gone >= Duration::from_millis(500), "{ttl_gone:?}");
    assert!(idle_gone.is_some(), "the idle session lived 60 s");
    for id in [&ttl, &idle] {
        assert_eq!(status_of(&d, &key, id), 404);
    }
    for init in &inits[..2] {
        assert!(init.gone_within(5_000), "{}", init.describe());
        let left: Vec<_> = init
            .leaves
            .iter()
            .filter(|l| Path::new(l).exists())
            .collect();
        assert!(left.is_empty(), "cgroup leaves left: {left:?}");
    }
    // The audit says why.
    let reasons = expiry_reasons(&d, &key);
    assert!(
        reasons.contains(&(ttl.clone(), "ttl".into())),
        "{reasons:?}"
    );
    assert!(
        reasons.contains(&(idle.clone(), "idle".into())),
        "{reasons:?}"
    );

    // Left alone, the busy one becomes idle too.
    assert!(
        eventually(6_000, || !listed(&d, &key).contains(&busy)),
        "an idle session was not reaped"
    );
    assert_nothing_left(&fx, &inits, &mounts_before);
}

/// What `PATCH /v1/sessions/{id}` sets is what the reaper goes by: a keep-alive
/// outlives the TTL given at create, a shorter TTL or a new idle timeout ends the
/// session, an idle timeout of 0 keeps an unused one. And what a PATCH answered
/// survives a SIGKILL of the daemon.
#[test]
fn updated_lifetimes_rule_the_reaper_and_survive_a_kill9() {
    if !setup() {
        return;
    }
    let _serial = serial();
    let fx = Fixture::new();
    let mounts_before = fx.mounts();
    let mut d = fx.start(&[]);
    let key = d.admin_key().to_string();
    let patch = |d: &Daemon, id: &str, body: Value| -> Value {
        let (status, s) = d.request(
            "PATCH",
            &format!("/v1/sessions/{id}"),
            Some(&key),
            Some(body),
        );
        assert_eq!(status, 200, "PATCH {id}: {s}");
        s
    };

    let kept = id_of(&create(&d, &key, json!({"ttl_seconds": 2})));
    let kept_created = Instant::now();
    patch(&d, &kept, json!({"ttl_seconds": 600}));
    let ended = id_of(&create(&d, &key, json!({"ttl_seconds": 600})));
    let idled = id_of(&create(&d, &key, json!({"idle_timeout_seconds": 600})));
    let unidled = id_of(&create(&d, &key, json!({"idle_timeout_seconds": 2})));
    let unidled_created = Instant::now();
    let inits: Vec<Init> = [&kept, &ended, &idled, &unidled]
        .iter()
        .map(|id| fx.init(id))
        .collect();
    patch(&d, &ended, json!({"ttl_seconds": 1}));
    let s = patch(&d, &unidled, json!({"idle_timeout_seconds": 0}));
    assert_eq!(s["idle_timeout_seconds"], Value::Null, "{s}");
    let s = patch(&d, &idled, json!({"idle_timeout_seconds": 2}));
    assert_eq!(s["idle_timeout_seconds"], 2, "{s}");

    assert!(
        eventually(8_000, || {
            let live = listed(&d, &key);
            !live.contains(&ended) && !live.contains(&idled)
        }),
        "a session whose TTL or idle timeout was shortened lives on: {:?}",
        listed(&d, &key)
    );
    // Past the TTL and the idle timeout they were created with (2 s, reaped within
    // about 1 s more), the other two are still there and still work.
    let waited = kept_created.min(unidled_created) + Duration::from_secs(5);
    std::thread::sleep(waited.saturating_duration_since(Instant::now()));
    let live = listed(&d, &key);
    assert!(live.contains(&kept), "the TTL given at create still ruled");
    assert!(
        live.contains(&unidled),
        "the idle timeout given at create still ruled"
    );
    assert_eq!(sh(&d, &key, &kept, "echo up"), "up\n");
    for init in &inits[1..3] {
        assert!(init.gone_within(5_000), "{}", init.describe());
    }
    assert_eq!(
        expiry_reasons(&d, &key),
        BTreeSet::from([
            (ended.clone(), "ttl".into()),
            (idled.clone(), "idle".into())
        ]),
        "the sessions the reaper ended, and why"
    );

    // What was answered is what the next daemon has, after a SIGKILL.
    let answered = patch(
        &d,
        &kept,
        json!({"ttl_seconds": 3600, "idle_timeout_seconds": 1800, "metadata": {"chat": "c9"}}),
    );
    d.kill9();
    let d2 = fx.start(&[]);
    let (status, now) = d2.request("GET", &format!("/v1/sessions/{kept}"), Some(&key), None);
    assert_eq!(status, 200, "{now}");
    for field in ["expires_at", "idle_timeout_seconds", "metadata"] {
        assert_eq!(
            now[field], answered[field],
            "{field} after a restart: {now}"
        );
    }
    let (status, found) = d2.request("GET", "/v1/sessions?metadata=chat%3Dc9", Some(&key), None);
    assert_eq!(status, 200, "{found}");
    assert_eq!(found["sessions"][0]["session_id"], kept.as_str(), "{found}");
    assert_eq!(found["sessions"].as_array().unwrap().len(), 1, "{found}");
    for id in [&kept, &unidled] {
        delete(&d2, &key, id);
    }
    assert_nothing_left(&fx, &inits, &mounts_before);
}

// 5. The warm pool -----------------------------------------------------------------

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

#[test]
fn warm_pool_fills_serves_refills_and_does_not_leak_across_a_restart() {
    if !setup() {
        return;
    }
    let _serial = serial();
    let fx = Fixture::new();
    let mounts_before = fx.mounts();
    let mut d = fx.start(&["--pool", "host=2"]);
    let key = d.admin_key().to_string();
    wait_pool(&d, "host", 2);
    // Pooled sandboxes wait at idle priority; a session's runs at normal priority.
    for row in fx.rows().into_iter().filter(|r| r.state == "pooled") {
        assert_eq!(
            sched_policy(row.init.pid),
            libc::SCHED_IDLE,
            "a pooled init"
        );
    }
    let session = create(&d, &key, json!({}));
    assert_eq!(session["pooled"], true, "{session}");
    let taken = id_of(&session);
    let taken_init = fx.init(&taken);
    assert_eq!(
        sched_policy(taken_init.pid),
        libc::SCHED_OTHER,
        "a taken init"
    );
    assert_eq!(sh(&d, &key, &taken, "echo ok"), "ok\n");
    delete(&d, &key, &taken);
    let mut inits = vec![taken_init];

    // create + first exec, from the pool and cold (custom limits are never pooled),
    // each with a full, idle pool so the filler does not compete.
    let mut measure = |body: Value, pooled: bool| -> Duration {
        wait_pool(&d, "host", 2);
        let started = Instant::now();
        let session = create(&d, &key, body);
        let id = id_of(&session);
        sh(&d, &key, &id, "echo ready");
        let took = started.elapsed();
        assert_eq!(session["pooled"], pooled, "{session}");
        inits.push(fx.init(&id));
        delete(&d, &key, &id);
        took
    };
    let pooled: Vec<Duration> = (0..10).map(|_| measure(json!({}), true)).collect();
    let cold: Vec<Duration> = (0..10)
        .map(|_| measure(json!({"limits": {"memory": "256M"}}), false))
        .collect();
    eprintln!(
        "create + first exec, median of 10: pooled {:.1} ms, cold {:.1} ms",
        median(pooled).as_secs_f64() * 1e3,
        median(cold).as_secs_f64() * 1e3
    );
    // A session env is applied per exec: still pooled.
    let session = create(&d, &key, json!({"env": {"GREETING": "hi"}}));
    assert_eq!(session["pooled"], true, "{session}");
    let id = id_of(&session);
    assert_eq!(sh(&d, &key, &id, "echo $GREETING"), "hi\n");
    inits.push(fx.init(&id));
    wait_pool(&d, "host", 2);

    // SIGKILL with a full pool and one live pooled session; the next daemon destroys
    // the old pool's sandboxes at start, and the session lives on.
    let pool_inits = |fx: &Fixture| -> Vec<Init> {
        fx.rows()
            .into_iter()
            .filter(|r| r.state == "pooled")
            .map(|r| r.init)
            .collect()
    };
    let old_pool = pool_inits(&fx);
    assert_eq!(old_pool.len(), 2, "pool rows in the database");
    d.kill9();
    assert!(old_pool.iter().all(Init::alive));
    let mut d2 = fx.start(&["--pool", "host=1"]);
    let gone = |pool: &[Init], when: &str| {
        for init in pool {
            assert!(
                init.gone_within(60_000),
                "pool sandbox left {when}: {}",
                init.describe()
            );
            let left: Vec<_> = init
                .leaves
                .iter()
                .filter(|l| Path::new(l).exists())
                .collect();
            assert!(left.is_empty(), "pool cgroup leaves left {when}: {left:?}");
        }
    };
    gone(&old_pool, "at the next start");
    inits.extend(old_pool);
    wait_pool(&d2, "host", 1);
    assert_eq!(sh(&d2, &key, &id, "echo $GREETING"), "hi\n");

    // SIGTERM: the pool is emptied (it belongs to no one), the session stays.
    let new_pool = pool_inits(&fx);
    assert_eq!(new_pool.len(), 1, "pool rows in the database");
    d2.stop();
    gone(&new_pool, "after SIGTERM");
    inits.extend(new_pool);
    assert_eq!(fx.session_dirs(), vec![id.clone()]);
    let d3 = fx.start(&[]);
    assert_eq!(pool_ready(&d3, "host"), None, "no pool configured now");
    assert_eq!(sh(&d3, &key, &id, "echo $GREETING"), "hi\n");
    delete(&d3, &key, &id);
    assert_nothing_left(&fx, &inits, &mounts_before);
}

/// `brig serve` with these flags, expected to stop by itself: its exit code and
/// stderr (killed and failed if it is still running after 20 s).
fn serve_expecting_exit(args: &[&std::ffi::OsStr]) -> (i32, String) {
    let mut child = common::brig()
        .arg("serve")
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start brig serve");
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut stderr = String::new();
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut stderr)
                .unwrap();
            return (status.code().unwrap_or(-1), stderr);
        }
        if Instant::now() > end {
            let _ = child.kill();
            let _ = child.wait();
            panic!("a second brig serve {args:?} kept running");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A second daemon on a data dir in use would take the first one's sandboxes for a
/// dead predecessor's (destroying its pool, re-attaching its sessions); it must stop
/// before touching anything. So must a daemon whose port is taken. The lock dies
/// with its daemon, however it dies: no sandbox inherits it.
#[test]
fn a_second_daemon_on_a_data_dir_in_use_stops_before_touching_anything() {
    if !setup() {
        return;
    }
    let _serial = serial();
    let fx = Fixture::new();
    let mounts_before = fx.mounts();
    let mut d = fx.start(&["--pool", "host=2"]);
    let key = d.admin_key().to_string();
    wait_pool(&d, "host", 2);
    let live = id_of(&create(&d, &key, json!({"limits": {"memory": "256M"}})));
    assert_eq!(sh(&d, &key, &live, "echo live"), "live\n");
    wait_pool(&d, "host", 2);
    let rows_before: Vec<(String, String)> =
        fx.rows().into_iter().map(|r| (r.id, r.state)).collect();
    let mut inits: Vec<Init> = fx.rows().into_iter().map(|r| r.init).collect();
    assert_eq!(inits.len(), 3, "two pooled sandboxes and a session");

    let port = common::daemon::free_port().to_string();
    let (data_dir, store) = (fx.data_dir(), fx.store());
    let (code, stderr) = serve_expecting_exit(&[
        "--data-dir".as_ref(),
        data_dir.as_os_str(),
        "--store".as_ref(),
        store.as_os_str(),
        "--listen".as_ref(),
        format!("127.0.0.1:{port}").as_ref(),
        "--pool".as_ref(),
        "host=1".as_ref(),
    ]);
    assert_ne!(code, 0, "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    assert!(
        stderr.contains(&format!("another brig serve (pid {}) is using", d.pid()))
            && stderr.contains(&*data_dir.to_string_lossy()),
        "{stderr}"
    );
    // Nothing of the first daemon's was touched: rows, sandboxes, pool, session.
    assert_eq!(
        fx.rows()
            .into_iter()
            .map(|r| (r.id, r.state))
            .collect::<Vec<_>>(),
        rows_before
    );
    assert!(
        inits.iter().all(Init::alive),
        "the first daemon's sandboxes live on"
    );
    assert_eq!(pool_ready(&d, "host"), Some(2));
    let pooled = create(&d, &key, json!({}));
    assert_eq!(pooled["pooled"], true, "{pooled}");
    let pooled = id_of(&pooled);
    assert_eq!(sh(&d, &key, &pooled, "echo pooled"), "pooled\n");
    inits.push(fx.init(&pooled));
    delete(&d, &key, &pooled);
    assert_eq!(sh(&d, &key, &live, "echo still"), "still\n");

    // Another data dir, but the first daemon's port: stops before creating anything.
    let other = fx.path().join("other-data");
    let (code, stderr) = serve_expecting_exit(&[
        "--data-dir".as_ref(),
        other.as_os_str(),
        "--store".as_ref(),
        store.as_os_str(),
        "--listen".as_ref(),
        d.addr().as_ref(),
    ]);
    assert_ne!(code, 0, "{stderr}");
    assert!(stderr.contains("cannot listen on"), "{stderr}");
    assert!(
        !other.exists(),
        "a daemon that cannot listen created its data dir"
    );

    // SIGKILL: the lock goes with the daemon (no sandbox holds it), so the next one
    // starts, re-attaches the session and can delete it.
    d.kill9();
    let d2 = fx.start(&[]);
    assert_eq!(sh(&d2, &key, &live, "echo again"), "again\n");
    delete(&d2, &key, &live);
    assert_nothing_left(&fx, &inits, &mounts_before);
}

/// The filler launches after a burst of creates, not during it (a launch is kernel
/// work that idle priority does not make preemptible, and a session just taken is
/// about to run its first exec), unless the pool runs low: then it refills during
/// the burst rather than let the next creates go cold.
#[test]
fn the_warm_pool_refills_after_a_burst_of_creates_unless_it_runs_low() {
    if !setup() {
        return;
    }
    let _serial = serial();
    let fx = Fixture::new();
    let mounts_before = fx.mounts();
    let mut d = fx.start(&["--pool", "host=16"]);
    let key = d.admin_key().to_string();
    wait_pool(&d, "host", 16);
    let mut inits = Vec::new();

    // Eight creates 30 ms apart (longer than the 100 ms a lone take waits): 8 of 16
    // ready is not low, so nothing is launched until the burst is over.
    let mut burst = Vec::new();
    for taken in 1..=8 {
        let session = create(&d, &key, json!({}));
        assert_eq!(session["pooled"], true, "{session}");
        burst.push(id_of(&session));
        assert_eq!(
            pool_ready(&d, "host"),
            Some(16 - taken),
            "the pool refilled during a burst of creates"
        );
        std::thread::sleep(Duration::from_millis(30));
    }
    wait_pool(&d, "host", 16);
    for id in &burst {
        inits.push(fx.init(id));
        delete(&d, &key, id);
    }

    // A longer burst (each session deleted at once): once fewer than 8 are ready the
    // filler launches anyway, so creates past the pool's 16 are still served from it.
    // A filler that waited for the burst to end would serve exactly the first 16 and
    // let the other 8 go cold. Not every one of them need be pooled: on a loaded
    // machine refills (at idle priority) can fall behind 25 creates a second.
    let mut pooled = Vec::new();
    for _ in 0..24 {
        let session = create(&d, &key, json!({}));
        pooled.push(session["pooled"] == true);
        let id = id_of(&session);
        inits.push(fx.init(&id));
        delete(&d, &key, &id);
        std::thread::sleep(Duration::from_millis(40));
    }
    assert!(
        pooled[..16].iter().all(|p| *p),
        "creates went cold with sandboxes ready: {pooled:?}"
    );
    assert!(
        pooled[16..].iter().any(|p| *p),
        "the pool did not refill during a burst: {pooled:?}"
    );
    inits.extend(
        fx.rows()
            .into_iter()
            .filter(|r| r.state == "pooled")
            .map(|r| r.init),
    );
    d.stop();
    assert_nothing_left(&fx, &inits, &mounts_before);
}

// 6. Snapshots and fork -------------------------------------------------------------

/// A minimal image tree: /bin/sh (dash) and a few tools with their libraries, an
/// empty /etc and a /data directory.
fn make_rootfs(root: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let bin = root.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let mut libs = BTreeSet::new();
    let tools = [
        ("sh", "dash"),
        ("cat", "cat"),
        ("ls", "ls"),
        ("true", "true"),
        ("sleep", "sleep"),
    ];
    for (name, host_name) in tools {
        let host = Path::new("/usr/bin").join(host_name);
        std::fs::copy(&host, bin.join(name)).unwrap_or_else(|e| panic!("copy {host:?}: {e}"));
        let ldd = Command::new("ldd").arg(&host).output().expect("ldd");
        for token in String::from_utf8_lossy(&ldd.stdout).split_whitespace() {
            if token.starts_with('/') {
                libs.insert(token.to_string());
            }
        }
    }
    for lib in libs {
        let dest = root.join(lib.trim_start_matches('/'));
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        // fs::copy reads through symlinks: libc.so.6 arrives as a file.
        std::fs::copy(&lib, &dest).unwrap_or_else(|e| panic!("copy {lib}: {e}"));
    }
    for dir in ["etc", "data"] {
        std::fs::create_dir_all(root.join(dir)).unwrap();
    }
    for dir in ["", "bin", "etc", "data"] {
        std::fs::set_permissions(root.join(dir), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
}

#[test]
fn snapshots_fork_and_restore_and_belong_to_their_tenant() {
    if !setup() {
        return;
    }
    let _serial = serial();
    let fx = Fixture::new();
    let mounts_before = fx.mounts();
    let tree = fx.path().join("rootfs");
    make_rootfs(&tree);
    let out = fx.image(&["import", "tiny", tree.to_str().unwrap()]);
    assert!(out.status.success(), "import: {out:?}");

    let d = fx.start(&[]);
    let key = d.admin_key().to_string();
    let (status, b) = d.request("POST", "/v1/keys", Some(&key), Some(json!({"tenant": "b"})));
    assert_eq!(status, 201, "{b}");
    let key_b = b["key"].as_str().unwrap().to_string();

    let origin = id_of(&create(&d, &key, json!({"image": "tiny"})));
    sh(&d, &key, &origin, "echo one > /data/x");
    let (status, snap) = d.request(
        "POST",
        &format!("/v1/sessions/{origin}/snapshots"),
        Some(&key),
        Some(json!({"name": "with-x"})),
    );
    assert_eq!(status, 201, "{snap}");
    let snap_id = snap["snapshot_id"].as_str().unwrap().to_string();
    assert_eq!(snap["name"], "with-x");
    assert_eq!(snap["session_id"], origin.as_str());
    assert_eq!(snap["image"], "tiny");
    assert!(snap["size_bytes"].as_u64().unwrap() > 0, "{snap}");
    // The session goes on after the snapshot (it was paused only meanwhile).
    assert_eq!(sh(&d, &key, &origin, "cat /data/x"), "one\n");

    // Fork: two sessions from the snapshot, each with its own copy.
    let forks: Vec<String> = (0..2)
        .map(|_| {
            let s = create(&d, &key, json!({"snapshot": snap_id}));
            assert_eq!(s["snapshot"], snap_id.as_str(), "{s}");
            id_of(&s)
        })
        .collect();
    for fork in &forks {
        assert_eq!(sh(&d, &key, fork, "cat /data/x"), "one\n");
    }
    sh(
        &d,
        &key,
        &forks[0],
        "echo two > /data/x; echo new > /data/y",
    );
    assert_eq!(sh(&d, &key, &forks[0], "cat /data/x"), "two\n");
    assert_eq!(sh(&d, &key, &forks[1], "cat /data/x; ls /data"), "one\nx\n");
    assert_eq!(sh(&d, &key, &origin, "cat /data/x; ls /data"), "one\nx\n");

    // Restore: the session's files are the snapshot's again, under the same id.
    sh(
        &d,
        &key,
        &origin,
        "echo changed > /data/x; echo extra > /data/z",
    );
    let replaced = fx.init(&origin);
    let (status, restored) = d.request(
        "POST",
        &format!("/v1/sessions/{origin}/restore"),
        Some(&key),
        Some(json!({"snapshot_id": snap_id})),
    );
    assert_eq!(status, 200, "{restored}");
    assert_eq!(restored["session_id"], origin.as_str());
    assert_eq!(restored["state"], "running");
    assert_eq!(sh(&d, &key, &origin, "cat /data/x; ls /data"), "one\nx\n");
    assert!(replaced.gone_within(10_000), "{}", replaced.describe());
    assert!(replaced.leaves.iter().all(|l| !Path::new(l).exists()));
    assert_ne!(fx.init(&origin).pid, replaced.pid);

    // List and get.
    let (status, list) = d.request("GET", "/v1/snapshots", Some(&key), None);
    assert_eq!(status, 200);
    let listed_ids: Vec<&str> = list["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["snapshot_id"].as_str().unwrap())
        .collect();
    assert_eq!(listed_ids, vec![snap_id.as_str()]);
    let (status, got) = d.request("GET", &format!("/v1/snapshots/{snap_id}"), Some(&key), None);
    assert_eq!((status, &got), (200, &snap));

    // Another tenant neither sees nor uses it.
    let (status, list) = d.request("GET", "/v1/snapshots", Some(&key_b), None);
    assert_eq!(status, 200);
    assert_eq!(list["snapshots"], json!([]));
    let (status, _) = d.request(
        "GET",
        &format!("/v1/snapshots/{snap_id}"),
        Some(&key_b),
        None,
    );
    assert_eq!(status, 404);
    let (status, e) = d.request(
        "POST",
        "/v1/sessions",
        Some(&key_b),
        Some(json!({"snapshot": snap_id})),
    );
    assert_eq!(status, 404, "{e}");
    assert_eq!(e["error"]["code"], "not_found");
    let own_b = id_of(&create(&d, &key_b, json!({"image": "tiny"})));
    let (status, _) = d.request(
        "POST",
        &format!("/v1/sessions/{own_b}/restore"),
        Some(&key_b),
        Some(json!({"snapshot_id": snap_id})),
    );
    assert_eq!(status, 404);
    let (status, _) = d.request(
        "DELETE",
        &format!("/v1/snapshots/{snap_id}"),
        Some(&key_b),
        None,
    );
    assert_eq!(status, 404);
    // ... nor snapshots another tenant's session.
    let (status, _) = d.request(
        "POST",
        &format!("/v1/sessions/{origin}/snapshots"),
        Some(&key_b),
        Some(json!({})),
    );
    assert_eq!(status, 404);

    // A paused session can be snapshotted, and stays paused.
    let fork = &forks[1];
    let (status, s) = d.request(
        "POST",
        &format!("/v1/sessions/{fork}/pause"),
        Some(&key),
        None,
    );
    assert_eq!(status, 200, "{s}");
    let (status, paused_snap) = d.request(
        "POST",
        &format!("/v1/sessions/{fork}/snapshots"),
        Some(&key),
        Some(json!({})),
    );
    assert_eq!(status, 201, "{paused_snap}");
    let (status, s) = d.request("GET", &format!("/v1/sessions/{fork}"), Some(&key), None);
    assert_eq!((status, s["state"].as_str()), (200, Some("paused")), "{s}");
    let (status, s) = d.request(
        "POST",
        &format!("/v1/sessions/{fork}/resume"),
        Some(&key),
        None,
    );
    assert_eq!(status, 200, "{s}");
    assert_eq!(sh(&d, &key, fork, "cat /data/x"), "one\n");
    let paused_snap_id = paused_snap["snapshot_id"].as_str().unwrap();
    let (status, _) = d.request(
        "DELETE",
        &format!("/v1/snapshots/{paused_snap_id}"),
        Some(&key),
        None,
    );
    assert_eq!(status, 204);

    // A session on the host's dirs is snapshotted too: its /tmp and /workspace
    // (tests/api/snapshots.rs has the details).
    let host = id_of(&create(&d, &key, json!({})));
    let (status, host_snap) = d.request(
        "POST",
        &format!("/v1/sessions/{host}/snapshots"),
        Some(&key),
        Some(json!({})),
    );
    assert_eq!(status, 201, "{host_snap}");
    assert_eq!(host_snap["base"], "host", "{host_snap}");
    assert_eq!(host_snap["image"], "", "{host_snap}");
    sh(&d, &key, &host, "true");
    let (status, _) = d.request(
        "DELETE",
        &format!(
            "/v1/snapshots/{}",
            host_snap["snapshot_id"].as_str().unwrap()
        ),
        Some(&key),
        None,
    );
    assert_eq!(status, 204);

    // Delete: gone for new sessions; the forks keep running on their layers.
    let (status, _) = d.request(
        "DELETE",
        &format!("/v1/snapshots/{snap_id}"),
        Some(&key),
        None,
    );
    assert_eq!(status, 204);
    let (status, _) = d.request("GET", &format!("/v1/snapshots/{snap_id}"), Some(&key), None);
    assert_eq!(status, 404);
    let (status, _) = d.request(
        "POST",
        "/v1/sessions",
        Some(&key),
        Some(json!({"snapshot": snap_id})),
    );
    assert_eq!(status, 404);
    assert_eq!(sh(&d, &key, &forks[1], "cat /data/x"), "one\n");

    // Every sandbox started here, the one replaced by the restore included.
    let mut every: Vec<Init> = fx.rows().into_iter().map(|r| r.init).collect();
    every.push(replaced);
    for id in [vec![origin, host], forks].concat() {
        delete(&d, &key, &id);
    }
    delete(&d, &key_b, &own_b);
    let out = fx.image(&["gc", "--unmount"]);
    assert!(out.status.success(), "gc --unmount: {out:?}");
    assert_nothing_left(&fx, &every, &mounts_before);
}

// 7. The python image and /v1/execute ---------------------------------------------

#[test]
fn root_slow_execute_draws_a_matplotlib_plot_in_the_python_image() {
    if !setup() {
        return;
    }
    // Built before taking the lock: minutes of CPU and network, no daemon yet.
    let fx = Fixture::new();
    let recipe = Path::new(env!("CARGO_MANIFEST_DIR")).join("images/python.toml");
    let started = Instant::now();
    let out = fx.image(&["build", "python", "-f", recipe.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "build python: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("built python in {:.0} s", started.elapsed().as_secs_f64());

    let _serial = serial();
    let mounts_before = fx.mounts();
    let d = fx.start(&["--default-image", "python"]);
    let key = d.admin_key().to_string();
    let code = r#"
import matplotlib.pyplot as plt
plt.plot([1, 2, 3], [1, 4, 9])
plt.title("squares")
plt.savefig("plot.png")
print("saved")
"#;
    let (status, result) = d.request(
        "POST",
        "/v1/execute",
        Some(&key),
        Some(json!({"code": code, "timeout_ms": 60_000})),
    );
    assert_eq!(status, 200, "{result}");
    assert_eq!(result["exit_code"], 0, "{result}");
    assert_eq!(result["stdout"], "saved\n", "{result}");
    let files = result["files"].as_array().unwrap();
    let plot = files
        .iter()
        .find(|f| f["path"] == "plot.png")
        .unwrap_or_else(|| panic!("plot.png not listed: {result}"));
    assert_eq!(plot["kind"], "file");
    let file_id = plot["file_id"].as_str().unwrap();
    let (status, png) = d.raw(
        "GET",
        &format!("/v1/files/{file_id}"),
        Some(&key),
        None,
        None,
    );
    assert_eq!(status, 200);
    assert!(
        png.starts_with(b"\x89PNG\r\n\x1a\n"),
        "not a PNG: {:?}",
        &png[..png.len().min(16)]
    );
    assert!(png.len() > 1000, "{} bytes", png.len());

    // The last line is shown as the REPL shows it (sys.displayhook: repr, as onyx's
    // sandbox does), so with numpy 2 the sum reads `np.int64(3)`.
    let execute = |code: &str| -> String {
        let (status, result) = d.request(
            "POST",
            "/v1/execute",
            Some(&key),
            Some(json!({"code": code, "timeout_ms": 60_000})),
        );
        assert_eq!(status, 200, "{result}");
        assert_eq!(result["exit_code"], 0, "{result}");
        result["stdout"].as_str().unwrap().to_string()
    };
    let shown = execute("import numpy as np, pandas\nnp.arange(3).sum()");
    assert_eq!(
        shown,
        execute("import numpy as np\nprint(repr(np.arange(3).sum()))")
    );
    assert!(
        ["3\n", "np.int64(3)\n"].contains(&shown.as_str()),
        "{shown:?}"
    );
    assert_eq!(
        execute("import numpy as np\nint(np.arange(3).sum())"),
        "3\n"
    );
    assert_eq!(
        execute("import pandas as pd\npd.Series([1, 2, 3]).sum().item()"),
        "6\n"
    );
    let (status, result) = d.request(
        "POST",
        "/v1/execute",
        Some(&key),
        Some(json!({
            "code": "import numpy as np\nnp.arange(3).sum()",
            "last_line_interactive": false,
            "timeout_ms": 60_000,
        })),
    );
    assert_eq!(status, 200, "{result}");
    assert_eq!(result["stdout"], "", "{result}");

    // /v1/execute leaves no session behind (each is deleted right after its run).
    assert!(
        eventually(10_000, || listed(&d, &key).is_empty()),
        "sessions left: {:?}",
        listed(&d, &key)
    );
    drop(d);
    // Ended sessions leave no rows to name their sandboxes by; any sandbox still
    // running would have been orphaned to this process (the subreaper) when the
    // daemon stopped.
    assert!(
        eventually(10_000, || orphaned_inits(&[]).is_empty()),
        "sandboxes left: {:?}",
        orphaned_inits(&[])
    );
    let out = fx.image(&["gc", "--unmount"]);
    assert!(out.status.success(), "gc --unmount: {out:?}");
    assert_eq!(fx.session_dirs(), Vec::<String>::new());
    let mounts: Vec<_> = fx.mounts().difference(&mounts_before).cloned().collect();
    assert!(mounts.is_empty(), "mounts left: {mounts:#?}");
}
