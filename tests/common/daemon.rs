//! A real `brig serve` for black-box tests of the HTTP API.
//!
//! `Daemon::start(&[...])` spawns the daemon on a free loopback port with a temporary
//! data dir and store, waits for `/health` and reads the admin key that the first start
//! writes to `<data-dir>/admin.key`. `Daemon::start_in(data_dir, store, &[...])` starts
//! one on directories the caller owns (restarts on the same state: keep a
//! `tempfile::TempDir` alive across both starts).
//!
//! Dropping a running daemon cleans up like a careful operator: it deletes every
//! session still listed for the keys it has seen (the admin key and any key returned
//! by `POST /v1/keys`), stops the daemon with SIGTERM (which by design does *not* end
//! live sessions), and then checks that no sandbox process and no cgroup leaf the
//! daemon reported is left, and that its own temporary directory is gone.

use std::collections::BTreeSet;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;
use ureq::http::Response;

pub struct Daemon {
    child: Option<Child>,
    /// The daemon's pid (kept after it exits, for messages).
    pid: u32,
    addr: String,
    data_dir: PathBuf,
    store: PathBuf,
    log: PathBuf,
    admin_key: String,
    agent: ureq::Agent,
    /// Keys seen (admin, and those `POST /v1/keys` returned): Drop deletes the sessions
    /// each of them still lists.
    keys: Mutex<Vec<String>>,
    /// Every cgroup leaf a response reported (`enforced.cgroup.details.leaves`).
    leaves: Mutex<BTreeSet<String>>,
    /// The temporary directory of `start` (None for `start_in`): removed last.
    tmp: Option<tempfile::TempDir>,
}

/// An HTTP agent that returns error statuses as responses, with no overall timeout
/// (an exec or a stream may rightly take a while), only a connect timeout.
pub fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_connect(Some(Duration::from_secs(10)))
        .build()
        .into()
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Daemon {
    /// A daemon on a fresh temporary data dir and store.
    pub fn start(extra_args: &[&str]) -> Daemon {
        let tmp = tempfile::Builder::new()
            .prefix("brig-daemon-test-")
            .tempdir()
            .unwrap();
        let data_dir = tmp.path().join("data");
        let store = tmp.path().join("store");
        let mut daemon = Daemon::spawn(
            &data_dir,
            &store,
            &tmp.path().join("daemon.log"),
            extra_args,
        );
        daemon.tmp = Some(tmp);
        daemon
    }

    /// A daemon on directories the caller owns (e.g. a restart on the same state). The
    /// log goes next to `data_dir` (`<data_dir>.log`).
    pub fn start_in(data_dir: &Path, store: &Path, extra_args: &[&str]) -> Daemon {
        let mut log = data_dir.as_os_str().to_owned();
        log.push(".log");
        Daemon::spawn(data_dir, store, Path::new(&log), extra_args)
    }

    fn spawn(data_dir: &Path, store: &Path, log: &Path, extra_args: &[&str]) -> Daemon {
        // The port is free when chosen; another process may take it before the daemon
        // binds it, so a daemon that exits at once is started again on another port.
        for attempt in 0..5 {
            let addr = format!("127.0.0.1:{}", free_port());
            let log_file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(log)
                .unwrap();
            let mut cmd = Command::new(env!("CARGO_BIN_EXE_brig"));
            cmd.env("NO_COLOR", "1")
                .env_remove("BRIG_ID_RANGE")
                .env_remove("BRIG_CGROUP_PARENT")
                .env_remove("BRIG_STORE")
                .arg("serve")
                .arg("--data-dir")
                .arg(data_dir)
                .arg("--store")
                .arg(store)
                .arg("--listen")
                .arg(&addr)
                .args(extra_args);
            // A daemon without its default image builds it at start (minutes, from
            // Debian and PyPI): tests opt in by naming the recipe to build from.
            if !extra_args.contains(&"--default-image-recipe") {
                cmd.arg("--no-build-default-image");
            }
            cmd.stdin(Stdio::null())
                .stdout(log_file.try_clone().unwrap())
                .stderr(log_file);
            let child = cmd.spawn().expect("start brig serve");
            let pid = child.id();
            let mut daemon = Daemon {
                child: Some(child),
                pid,
                addr,
                data_dir: data_dir.to_path_buf(),
                store: store.to_path_buf(),
                log: log.to_path_buf(),
                admin_key: String::new(),
                agent: agent(),
                keys: Mutex::new(Vec::new()),
                leaves: Mutex::new(BTreeSet::new()),
                tmp: None,
            };
            match daemon.wait_ready() {
                Ok(()) => {
                    let key = std::fs::read_to_string(data_dir.join("admin.key"))
                        .expect("the daemon wrote <data-dir>/admin.key");
                    daemon.admin_key = key.trim().to_string();
                    daemon.keys.lock().unwrap().push(daemon.admin_key.clone());
                    return daemon;
                }
                Err(exited) if exited && attempt < 4 => {
                    daemon.child = None;
                    continue;
                }
                Err(_) => {
                    daemon.kill_now();
                    panic!(
                        "brig serve did not become ready; log:\n{}",
                        daemon.log_text()
                    );
                }
            }
        }
        unreachable!()
    }

    /// Ok once /health answers 200; Err(true) if the daemon exited first.
    fn wait_ready(&mut self) -> Result<(), bool> {
        let end = Instant::now() + Duration::from_secs(60);
        while Instant::now() < end {
            if let Some(child) = self.child.as_mut() {
                if child.try_wait().unwrap().is_some() {
                    return Err(true);
                }
            }
            if let Ok(r) = self.agent.get(self.url("/health")).call() {
                if r.status() == 200 {
                    return Ok(());
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(false)
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// `IP:PORT`.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn admin_key(&self) -> &str {
        &self.admin_key
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    pub fn store(&self) -> &Path {
        &self.store
    }

    /// What the daemon logged so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Whether the daemon process is still running.
    pub fn running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(child) => child.try_wait().unwrap().is_none(),
            None => false,
        }
    }

    /// Adds a key whose sessions Drop deletes (keys from `POST /v1/keys` are added
    /// automatically).
    pub fn remember_key(&self, key: &str) {
        let mut keys = self.keys.lock().unwrap();
        if !keys.iter().any(|k| k == key) {
            keys.push(key.to_string());
        }
    }

    /// A request; the response for streaming (SSE, large downloads) or headers.
    /// `body` is sent as is with `content_type`: `()` for none, a `Vec<u8>` (with a
    /// Content-Length), or `ureq::SendBody::from_owned_reader(..)` (streamed, chunked).
    pub fn send(
        &self,
        method: &str,
        path: &str,
        key: Option<&str>,
        content_type: Option<&str>,
        body: impl ureq::AsSendBody,
    ) -> Response<ureq::Body> {
        self.try_send(method, path, key, content_type, body)
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
    }

    /// As [`Daemon::send`], with transport errors returned: a server that refuses a
    /// body early (413) may close the connection while the client still sends it.
    pub fn try_send(
        &self,
        method: &str,
        path: &str,
        key: Option<&str>,
        content_type: Option<&str>,
        body: impl ureq::AsSendBody,
    ) -> Result<Response<ureq::Body>, ureq::Error> {
        let mut builder = ureq::http::Request::builder()
            .method(method)
            .uri(self.url(path));
        if let Some(key) = key {
            builder = builder.header("Authorization", format!("Bearer {key}"));
        }
        if let Some(ct) = content_type {
            builder = builder.header("Content-Type", ct);
        }
        self.agent.run(builder.body(body).unwrap())
    }

    /// A request with a JSON body (or none); the status and the parsed JSON response
    /// (`Value::Null` for an empty body, a string for a body that is not JSON).
    pub fn request(
        &self,
        method: &str,
        path: &str,
        key: Option<&str>,
        body: Option<Value>,
    ) -> (u16, Value) {
        let body = body.map(|b| serde_json::to_vec(&b).unwrap());
        let has_body = body.is_some();
        let (status, bytes) = self.raw(
            method,
            path,
            key,
            has_body.then_some("application/json"),
            body,
        );
        let value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
        };
        self.observe(&value);
        (status, value)
    }

    /// A request with a raw body; the status and the whole response body.
    pub fn raw(
        &self,
        method: &str,
        path: &str,
        key: Option<&str>,
        content_type: Option<&str>,
        body: Option<Vec<u8>>,
    ) -> (u16, Vec<u8>) {
        let response = match body {
            Some(body) => self.send(method, path, key, content_type, body),
            None => self.send(method, path, key, content_type, ()),
        };
        read_whole(response).unwrap_or_else(|e| panic!("{method} {path}: reading the body: {e}"))
    }

    /// Records keys and cgroup leaves found in a response.
    fn observe(&self, value: &Value) {
        if let (Some(key), Some(_)) = (value["key"].as_str(), value.get("key_id")) {
            self.remember_key(key);
        }
        let mut sessions = vec![value];
        if let Some(list) = value["sessions"].as_array() {
            sessions.extend(list.iter());
        }
        let mut leaves = self.leaves.lock().unwrap();
        for s in sessions {
            if let Some(list) = s["enforced"]["cgroup"]["details"]["leaves"].as_array() {
                leaves.extend(list.iter().filter_map(|l| l.as_str().map(String::from)));
            }
        }
    }

    /// Every cgroup leaf a response has reported so far.
    pub fn seen_leaves(&self) -> Vec<String> {
        self.leaves.lock().unwrap().iter().cloned().collect()
    }

    /// The daemon's live descendants (sandbox inits, their watchdogs, launch helpers
    /// in flight), found through `/proc/<pid>/task/*/children`. Its launch zygote,
    /// which lives as long as the daemon, is left out, and so are exited processes
    /// not yet reaped.
    pub fn descendants(&self) -> Vec<u32> {
        let mut found = Vec::new();
        let mut todo = vec![self.pid];
        while let Some(pid) = todo.pop() {
            let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
                continue;
            };
            for task in tasks.flatten() {
                let children =
                    std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
                for child in children.split_whitespace().filter_map(|c| c.parse().ok()) {
                    if !found.contains(&child) {
                        if !is_zygote(child) && !is_zombie(child) {
                            found.push(child);
                        }
                        todo.push(child);
                    }
                }
            }
        }
        found
    }

    /// Deletes every session listed for each key seen, and waits (up to 10 s) until
    /// none is listed (sessions of `/v1/execute` are deleted in the background).
    pub fn delete_all_sessions(&self) {
        let keys = self.keys.lock().unwrap().clone();
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            let mut listed = 0;
            for key in &keys {
                let (status, list) = self.request("GET", "/v1/sessions", Some(key), None);
                if status != 200 {
                    continue;
                }
                for s in list["sessions"].as_array().cloned().unwrap_or_default() {
                    listed += 1;
                    if let Some(id) = s["session_id"].as_str() {
                        self.request("DELETE", &format!("/v1/sessions/{id}"), Some(key), None);
                    }
                }
            }
            if listed == 0 || Instant::now() > end {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Removes every image in the store and unmounts its layers (`brig image gc
    /// --unmount`), so that the store can be deleted.
    pub fn clean_store(&self) {
        let image = |args: &[&str]| {
            Command::new(env!("CARGO_BIN_EXE_brig"))
                .env_remove("BRIG_STORE")
                .arg("image")
                .args(args)
                .arg("--store")
                .arg(&self.store)
                .stdin(Stdio::null())
                .stderr(Stdio::null())
                .output()
                .expect("run brig image")
        };
        if !self.store.exists() {
            return;
        }
        let listed = image(&["ls", "--json"]);
        let names: Vec<String> = serde_json::from_slice::<Value>(&listed.stdout)
            .ok()
            .and_then(|v| v.as_array().cloned())
            .unwrap_or_default()
            .iter()
            .filter_map(|i| i["name"].as_str().map(String::from))
            .collect();
        for name in names {
            image(&["rm", &name]);
        }
        image(&["gc", "--unmount"]);
    }

    /// SIGTERM and wait (30 s, then SIGKILL). Live sessions are meant to survive this.
    pub fn stop(&mut self) {
        self.signal_and_wait(libc::SIGTERM, Duration::from_secs(30));
    }

    /// SIGKILL and wait.
    pub fn kill9(&mut self) {
        self.signal_and_wait(libc::SIGKILL, Duration::from_secs(30));
    }

    fn kill_now(&mut self) {
        self.signal_and_wait(libc::SIGKILL, Duration::from_secs(30));
    }

    fn signal_and_wait(&mut self, signal: i32, patience: Duration) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if child.try_wait().unwrap().is_none() {
            let pid = nix::unistd::Pid::from_raw(child.id() as i32);
            if let Ok(signal) = nix::sys::signal::Signal::try_from(signal) {
                let _ = nix::sys::signal::kill(pid, signal);
            }
            let end = Instant::now() + patience;
            while child.try_wait().unwrap().is_none() {
                if Instant::now() > end {
                    eprintln!("brig serve ignored signal {signal} for {patience:?}: SIGKILL");
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    /// The checks Drop makes, as a list of problems (empty: clean).
    fn cleanup(&mut self) -> Vec<String> {
        let mut problems = Vec::new();
        if !self.running() {
            return problems;
        }
        self.delete_all_sessions();
        let pids = self.descendants();
        self.stop();
        let alive = |pid: &u32| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .map(|s| {
                    // A zombie waits for its (new) parent; it holds nothing.
                    let state = s.rsplit(')').next().unwrap_or("").trim_start();
                    !state.starts_with('Z')
                })
                .unwrap_or(false)
        };
        if !eventually(5000, || !pids.iter().any(alive)) {
            let left: Vec<_> = pids.iter().filter(|p| alive(p)).collect();
            problems.push(format!("sandbox processes left after stop: {left:?}"));
        }
        let leaves = self.seen_leaves();
        if !eventually(5000, || !leaves.iter().any(|l| Path::new(l).exists())) {
            let left: Vec<_> = leaves.iter().filter(|l| Path::new(l).exists()).collect();
            problems.push(format!("cgroup leaves left after stop: {left:?}"));
        }
        // With no session left, the daemon unmounts every volume when it stops.
        let mounted = self.mounts_in_data_dir();
        if !mounted.is_empty() {
            problems.push(format!(
                "mounts left in the data dir after stop: {mounted:?}"
            ));
            for path in mounted.iter().rev() {
                let _ = Command::new("umount").arg("-l").arg(path).status();
            }
        }
        problems
    }

    /// Mount points in this daemon's data dir (volumes), in mount order.
    fn mounts_in_data_dir(&self) -> Vec<String> {
        let prefix = format!("{}/", self.data_dir.display());
        super::host_mount_points()
            .into_iter()
            .filter(|point| point.starts_with(&prefix))
            .collect()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let panicking = std::thread::panicking();
        let problems = self.cleanup();
        // Whatever happened, the daemon is gone before its directories are.
        self.kill_now();
        if panicking {
            eprintln!(
                "brig serve log ({}):\n{}",
                self.log.display(),
                self.log_text()
            );
        }
        // Volumes a failed test left mounted would keep the data dir busy.
        for path in self.mounts_in_data_dir().iter().rev() {
            let _ = Command::new("umount").arg("-l").arg(path).status();
        }
        if let Some(tmp) = self.tmp.take() {
            // Layers mounted from the store (images, snapshots) would keep it busy.
            self.clean_store();
            let path = tmp.path().to_path_buf();
            if let Err(e) = tmp.close() {
                eprintln!("cannot remove {}: {e}", path.display());
            }
            if path.exists() && !panicking {
                panic!(
                    "the daemon's temporary directory {} is left",
                    path.display()
                );
            }
        }
        if !problems.is_empty() && !panicking {
            panic!("unclean daemon shutdown: {}", problems.join("; "));
        }
    }
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
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A response's status and whole body.
pub fn read_whole(response: Response<ureq::Body>) -> std::io::Result<(u16, Vec<u8>)> {
    let status = response.status().as_u16();
    let mut bytes = Vec::new();
    response.into_body().into_reader().read_to_end(&mut bytes)?;
    Ok((status, bytes))
}

/// Whether `pid` is a daemon's launch zygote (`brig_jail::zygote` names it).
pub fn is_zygote(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .is_ok_and(|comm| comm.trim() == "brig-zygote")
}

/// Whether `pid` has exited and waits to be reaped.
pub fn is_zombie(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The state follows the command's name, which may hold anything but ')'.
    stat.rsplit_once(") ")
        .is_some_and(|(_, rest)| rest.starts_with('Z'))
}
