//! A sandbox's tree is hostile to every operation brig runs on it as host root.
//!
//! Each test here performs an attack a tenant can make with its own key (or a
//! sandbox with its own processes) on an operation of brig's over the sandbox's
//! files, and checks that nothing of the host's is read or changed. No test reads a
//! real secret: each plants a marker in a root-only host directory of its own and
//! checks the marker never comes back.

use std::path::Path;

use crate::common;
use crate::common::daemon::Daemon;
use crate::common::sessions::tenant_key;
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

/// While a snapshot is cut, the tenant deletes a directory the packer has listed
/// and puts back a symlink of the same name to a host directory: the attack that
/// read the daemon's admin key. The swap is made at a range of delays into the
/// snapshot, so that it lands at every stage of the cut. The snapshot (and every
/// fork of it) must hold only the tenant's own files, and the host's marker must
/// never reach the store.
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
    let delete_zzz = format!("/v1/sessions/{id}/files?path=/workspace/zzz&recursive=true");
    let put_swap = format!("/v1/sessions/{id}/archive?path=/workspace");
    let mut raced = 0;
    for delay_ms in [50, 150, 300, 450, 600, 800, 1000] {
        // A large, incompressible file keeps the snapshot busy for a while.
        let r = sh(
            &d,
            &key,
            &id,
            "rm -rf /workspace/zzz && mkdir /workspace/zzz \
             && head -c 200M /dev/urandom > /workspace/zzz/big && echo ok > /workspace/zzz/small",
        );
        assert_eq!(r["exit_code"], 0, "{r}");
        let (swapped, (status, snapshot)) = std::thread::scope(|scope| {
            let taking = scope.spawn(|| {
                d.request(
                    "POST",
                    &format!("/v1/sessions/{id}/snapshots"),
                    Some(&key),
                    Some(json!({})),
                )
            });
            std::thread::sleep(std::time::Duration::from_millis(delay_ms));
            let mut statuses = Vec::new();
            if !taking.is_finished() {
                statuses.push(d.raw("DELETE", &delete_zzz, Some(&key), None, None).0);
                statuses.push(
                    d.raw("PUT", &put_swap, Some(&key), None, Some(swap.clone()))
                        .0,
                );
            }
            // The premise: the swap was over before the snapshot was.
            let swapped = !statuses.is_empty() && !taking.is_finished();
            for status in statuses {
                assert!([200, 201, 204, 409].contains(&status), "{status}");
            }
            (swapped, taking.join().unwrap())
        });
        raced += usize::from(swapped);
        // The snapshot may be refused (409: the tree was being changed), never made
        // of host files.
        assert!(
            [201, 409].contains(&status),
            "{delay_ms} ms: {status} {snapshot}"
        );
        assert!(
            !marker.found_below(&d.store().join("layers")),
            "{delay_ms} ms: the host's marker is in a layer"
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
            assert_eq!(r["stdout"], "clean\n", "{delay_ms} ms: {r}");
            delete(&d, &key, &format!("/v1/sessions/{fork}"));
            delete(&d, &key, &format!("/v1/snapshots/{snap}"));
        }
    }
    assert!(
        raced >= 2,
        "only {raced} swaps landed while a snapshot was cut"
    );
    delete(&d, &key, &format!("/v1/sessions/{id}"));
    assert_eq!(
        std::fs::read_to_string(marker.path().join("marker")).unwrap(),
        format!("{}\n", marker.text),
        "the host's marker file changed"
    );
}
