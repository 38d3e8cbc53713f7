//! A sandbox's tree is hostile to every operation brig runs on it as host root.
//!
//! Each test here performs an attack a tenant can make with its own key (or a
//! sandbox with its own processes) on an operation of brig's over the sandbox's
//! files, and checks that nothing of the host's is read or changed. No test reads a
//! real secret: each plants a marker in a root-only host directory of its own and
//! checks the marker never comes back.

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use common::daemon::Daemon;
use serde_json::{json, Value};

/// A root-only host directory (0700, outside /tmp, which sandboxes get a tmpfs of
/// their own over) holding a marker file no sandbox may ever read.
struct Marker {
    dir: tempfile::TempDir,
    text: String,
}

impl Marker {
    fn new() -> Marker {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::Builder::new()
            .prefix("brig-hostile-tree-")
            .tempdir_in("/var/tmp")
            .unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let text = common::unique("host-marker-");
        let file = dir.path().join("marker");
        std::fs::write(&file, format!("{text}\n")).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        Marker { dir, text }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Whether any file below `dir` on the host holds the marker.
    fn found_below(&self, dir: &Path) -> bool {
        std::process::Command::new("grep")
            .args(["-rqaF", &self.text])
            .arg(dir)
            .status()
            .unwrap()
            .success()
    }
}

fn tenant_key(d: &Daemon, tenant: &str) -> String {
    let (status, k) = d.request(
        "POST",
        "/v1/keys",
        Some(d.admin_key()),
        Some(json!({"tenant": tenant, "name": format!("{tenant}-key")})),
    );
    assert_eq!(status, 201, "{k}");
    k["key"].as_str().unwrap().to_string()
}

fn create(d: &Daemon, key: &str, body: Value) -> String {
    let (status, s) = d.request("POST", "/v1/sessions", Some(key), Some(body));
    assert_eq!(status, 201, "create session: {s}");
    s["session_id"].as_str().unwrap().to_string()
}

fn sh(d: &Daemon, key: &str, id: &str, cmd: &str) -> Value {
    let (status, r) = d.request(
        "POST",
        &format!("/v1/sessions/{id}/exec"),
        Some(key),
        Some(json!({ "cmd": cmd, "timeout_ms": 60_000 })),
    );
    assert_eq!(status, 200, "exec {cmd}: {r}");
    r
}

fn delete(d: &Daemon, key: &str, path: &str) {
    let (status, body) = d.request("DELETE", path, Some(key), None);
    assert_eq!(status, 204, "DELETE {path}: {body}");
}

/// A tar holding one symlink `name -> target`.
fn symlink_tar(name: &str, target: &Path) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Symlink);
    header.set_size(0);
    header.set_mode(0o777);
    builder
        .append_link(&mut header, name, target)
        .expect("a symlink entry");
    builder.into_inner().unwrap()
}

/// One files-API request of the attacker: when it started and ended, and its
/// status.
struct Attempt {
    started: Instant,
    ended: Instant,
    status: u16,
}

/// While a snapshot is cut, the tenant deletes the directory the packer reads and
/// puts back a symlink of the same name to a host directory, over and over: the
/// attack that read the daemon's admin key. The snapshot (and every fork of it)
/// must hold only the tenant's own files, and the host's marker must never reach
/// the store.
#[test]
fn root_a_symlink_swapped_in_while_a_snapshot_is_cut_never_packs_host_files() {
    require_root!();
    let marker = Marker::new();
    let d = Daemon::start(&[]);
    let key = tenant_key(&d, "attacker");
    let id = create(
        &d,
        &key,
        json!({"limits": {"disk": "512M", "memory": "512M"}}),
    );
    let swap = symlink_tar("zzz", marker.path());
    const ROUNDS: usize = 3;
    for round in 0..ROUNDS {
        // A large, incompressible file keeps the snapshot busy for a while.
        let r = sh(
            &d,
            &key,
            &id,
            "rm -rf /workspace/zzz && mkdir /workspace/zzz \
             && head -c 160M /dev/urandom > /workspace/zzz/big && echo ok > /workspace/zzz/small",
        );
        assert_eq!(r["exit_code"], 0, "{r}");
        let done = AtomicBool::new(false);
        let attempts = Mutex::new(Vec::new());
        let (started, status, snapshot, ended) = std::thread::scope(|scope| {
            scope.spawn(|| {
                while !done.load(Ordering::SeqCst) {
                    for (method, path, body) in [
                        (
                            "DELETE",
                            format!("/v1/sessions/{id}/files?path=/workspace/zzz&recursive=true"),
                            None,
                        ),
                        (
                            "PUT",
                            format!("/v1/sessions/{id}/archive?path=/workspace"),
                            Some(swap.clone()),
                        ),
                    ] {
                        let started = Instant::now();
                        let (status, _) = d.raw(method, &path, Some(&key), None, body);
                        attempts.lock().unwrap().push(Attempt {
                            started,
                            ended: Instant::now(),
                            status,
                        });
                    }
                }
            });
            let started = Instant::now();
            let (status, snapshot) = d.request(
                "POST",
                &format!("/v1/sessions/{id}/snapshots"),
                Some(&key),
                Some(json!({})),
            );
            let ended = Instant::now();
            done.store(true, Ordering::SeqCst);
            (started, status, snapshot, ended)
        });
        let attempts = attempts.into_inner().unwrap();
        let during = attempts
            .iter()
            .filter(|a| a.started >= started && a.ended <= ended)
            .count();
        // The premise: the attacker's requests ran while the snapshot was cut.
        assert!(
            during > 0,
            "round {round}: no swap ran during the snapshot ({} attempts in all)",
            attempts.len()
        );
        assert!(
            attempts
                .iter()
                .all(|a| [200, 201, 204, 404, 409].contains(&a.status)),
            "round {round}: statuses {:?}",
            attempts.iter().map(|a| a.status).collect::<Vec<_>>()
        );
        // The snapshot may be refused (409: the tree was being changed), never
        // made of host files.
        assert!(
            [201, 409].contains(&status),
            "round {round}: {status} {snapshot}"
        );
        assert!(
            !marker.found_below(&d.store().join("layers")),
            "round {round}: the host's marker is in a layer"
        );
        if status == 201 {
            let snap = snapshot["snapshot_id"].as_str().unwrap().to_string();
            let fork = create(&d, &key, json!({"snapshot": snap}));
            let r = sh(
                &d,
                &key,
                &fork,
                &format!(
                    "grep -rqsF '{}' /workspace /tmp && echo LEAKED || echo clean",
                    marker.text
                ),
            );
            assert_eq!(r["stdout"], "clean\n", "round {round}: {r}");
            delete(&d, &key, &format!("/v1/sessions/{fork}"));
            delete(&d, &key, &format!("/v1/snapshots/{snap}"));
        }
    }
    delete(&d, &key, &format!("/v1/sessions/{id}"));
    assert_eq!(
        std::fs::read_to_string(marker.path().join("marker")).unwrap(),
        format!("{}\n", marker.text),
        "the host's marker file changed"
    );
}
