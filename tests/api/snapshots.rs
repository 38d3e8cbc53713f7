//! Snapshots: taking, forking, deleting, and what a daemon killed mid-snapshot
//! leaves.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::common;
use crate::common::daemon::Daemon;
use crate::support::{
    assert_fields, create, daemon, delete_session, delete_snapshot, error_code, files_url,
    import_tiny_image, leaves_of, noise, restore, sandboxes, session_count, sh, sid, snapshot_ids,
    store_contents, take_snapshot, tenant_key,
};
use serde_json::{json, Value};

/// Snapshots are EROFS layers, and erofs-utils 1.5 cannot pack a file name of 255
/// bytes (Linux's most): such a name used to fail the snapshot with 500 after
/// freezing the session. It is now refused before packing, as the caller's to fix
/// (422 naming the path), and the session goes on as it was.
#[test]
fn root_snapshot_refuses_a_name_a_layer_cannot_hold() {
    require_root!();
    let d = daemon(&[]);
    let key = d.admin_key().to_string();
    let id = sid(&create(&d, &key, json!({})));
    sh(
        &d,
        &key,
        &id,
        "mkdir -p /workspace/deep/er && touch /workspace/deep/er/$(head -c 255 /dev/zero | tr '\\0' x)",
    );
    let snapshot = format!("/v1/sessions/{id}/snapshots");
    let (status, r) = d.request("POST", &snapshot, Some(&key), Some(json!({})));
    assert_eq!(status, 422, "{r}");
    assert_eq!(r["error"]["code"], "invalid_request", "{r}");
    let message = r["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("/workspace/deep/er/xxxx") && message.contains("255 bytes"),
        "{message}"
    );
    assert!(message.len() < 300, "the path is cut: {message}");
    let (_, session) = d.request("GET", &format!("/v1/sessions/{id}"), Some(&key), None);
    assert_eq!(session["state"], "running", "{session}");
    let (_, list) = d.request("GET", "/v1/snapshots", Some(&key), None);
    assert_eq!(list["snapshots"], json!([]));
    // 254 bytes fit.
    sh(
        &d,
        &key,
        &id,
        "rm /workspace/deep/er/* && touch /workspace/deep/er/$(head -c 254 /dev/zero | tr '\\0' x)",
    );
    let (status, r) = d.request("POST", &snapshot, Some(&key), Some(json!({})));
    assert_eq!(status, 201, "{r}");
    delete_session(&d, &key, &id);
    let snap = r["snapshot_id"].as_str().unwrap();
    let (status, _) = d.request("DELETE", &format!("/v1/snapshots/{snap}"), Some(&key), None);
    assert_eq!(status, 204);
}

/// What a host session's /tmp and /workspace hold, as the checks below see them:
/// contents, modes, symlinks, owners (as the session's own user).
const HOST_STATE: &str = "cd /workspace && cat proj/sub/a.txt && proj/run.sh && readlink proj/link \
     && cat proj/link && test ! -e proj/deleted && echo deleted-stays-deleted \
     && cat private ro/f /tmp/t/f && stat -c '%n %a' proj/run.sh private ro /tmp/t \
     && test \"$(find /workspace /tmp -mindepth 1 ! -user \"$(id -u)\" | wc -l)\" = 0 \
     && echo all-mine && sha256sum noise && find /workspace /tmp -mindepth 1 ! -path '/tmp/.brig*' | sort";

/// Tenant a's host session `origin` with files, modes, a link, a deletion and 3 MB
/// of noise in /workspace and /tmp (and a background process's output in the
/// daemon's /tmp/.brig), snapshotted as `snap` (named "host"); tenant b.
struct HostSnapshot {
    d: Daemon,
    a: String,
    b: String,
    origin: String,
    /// [`HOST_STATE`] in the origin when snapshotted.
    before: String,
    snap: Value,
    snap_id: String,
}

fn host_snapshot() -> HostSnapshot {
    let d = daemon(&[]);
    let (a, _) = tenant_key(&d, "a");
    let (b, _) = tenant_key(&d, "b");
    let origin = sid(&create(&d, &a, json!({})));
    assert_eq!(
        d.request("GET", &format!("/v1/sessions/{origin}"), Some(&a), None)
            .1["image"],
        Value::Null
    );
    sh(
        &d,
        &a,
        &origin,
        "mkdir -p /workspace/proj/sub && echo hello > /workspace/proj/sub/a.txt \
         && printf '#!/bin/sh\\necho ran\\n' > /workspace/proj/run.sh && chmod 750 /workspace/proj/run.sh \
         && ln -s sub/a.txt /workspace/proj/link \
         && echo gone > /workspace/proj/deleted && rm /workspace/proj/deleted \
         && echo secret > /workspace/private && chmod 600 /workspace/private \
         && mkdir /workspace/ro && echo ro > /workspace/ro/f && chmod 555 /workspace/ro \
         && mkdir /tmp/t && echo tmpdata > /tmp/t/f && chmod 700 /tmp/t \
         && head -c 3000000 /dev/urandom > /workspace/noise",
    );
    // The daemon's own files in /tmp (a background process's output) are not kept.
    let (status, p) = d.request(
        "POST",
        &format!("/v1/sessions/{origin}/processes"),
        Some(&a),
        Some(json!({"cmd": "echo background"})),
    );
    assert_eq!(status, 201, "{p}");
    let (status, _) = d.request(
        "POST",
        &format!(
            "/v1/sessions/{origin}/processes/{}/wait?timeout_ms=5000",
            p["process_id"]
        ),
        Some(&a),
        None,
    );
    assert_eq!(status, 200);
    assert_eq!(sh(&d, &a, &origin, "ls /tmp/.brig"), "jobs\n");
    let before = sh(&d, &a, &origin, HOST_STATE);
    assert!(
        before.starts_with(
            "hello\nran\nsub/a.txt\nhello\ndeleted-stays-deleted\nsecret\nro\ntmpdata\n"
        ),
        "{before}"
    );
    assert!(
        before.contains("proj/run.sh 750\nprivate 600\nro 555\n/tmp/t 700\n"),
        "{before}"
    );

    let (status, snap) = d.request(
        "POST",
        &format!("/v1/sessions/{origin}/snapshots"),
        Some(&a),
        Some(json!({"name": "host"})),
    );
    assert_eq!(status, 201, "{snap}");
    let snap_id = snap["snapshot_id"].as_str().unwrap().to_string();
    HostSnapshot {
        d,
        a,
        b,
        origin,
        before,
        snap,
        snap_id,
    }
}

impl HostSnapshot {
    /// A session of tenant a's from the snapshot: its id.
    fn fork(&self) -> String {
        let fork = create(&self.d, &self.a, json!({"snapshot": self.snap_id}));
        assert_eq!(
            (&fork["snapshot"], &fork["image"]),
            (&json!(self.snap_id), &Value::Null),
            "{fork}"
        );
        sid(&fork)
    }

    /// Deletes the snapshot (204) and tenant a's sessions `ids` and origin.
    fn clean(&self, ids: &[&String]) {
        let (status, _) = self.d.request(
            "DELETE",
            &format!("/v1/snapshots/{}", self.snap_id),
            Some(&self.a),
            None,
        );
        assert_eq!(status, 204);
        for id in ids.iter().copied().chain([&self.origin]) {
            delete_session(&self.d, &self.a, id);
        }
    }
}

#[test]
fn root_a_host_sessions_snapshot_describes_it_and_the_session_goes_on_unchanged() {
    require_root!();
    let h = host_snapshot();
    let HostSnapshot {
        d, a, origin, snap, ..
    } = &h;
    assert_fields(
        snap,
        &[
            "snapshot_id",
            "name",
            "session_id",
            "image",
            "base",
            "created_at",
            "size_bytes",
            "mounts",
        ],
    );
    assert_eq!(
        (&snap["base"], &snap["image"]),
        (&json!("host"), &json!("")),
        "{snap}"
    );
    assert!(snap["size_bytes"].as_u64().unwrap() > 1_000_000, "{snap}");
    // The original goes on unchanged.
    assert_eq!(sh(d, a, origin, "cat /workspace/proj/sub/a.txt"), "hello\n");
    h.clean(&[]);
}

#[test]
fn root_forks_of_a_host_snapshot_each_have_their_own_copy_of_tmp_and_workspace() {
    require_root!();
    let h = host_snapshot();
    let HostSnapshot { d, a, origin, .. } = &h;
    // Two forks, each with its own copy of the files; the daemon's files stayed out.
    let forks: Vec<String> = (0..2).map(|_| h.fork()).collect();
    let expected = h.before.clone();
    for fork in &forks {
        let state = sh(d, a, fork, HOST_STATE);
        assert_eq!(state, expected, "fork {fork}");
        assert_eq!(
            sh(d, a, fork, "test ! -e /tmp/.brig && echo none"),
            "none\n"
        );
    }
    sh(
        d,
        a,
        &forks[0],
        "echo f1 > /workspace/proj/f1 && echo t1 > /tmp/t1 && rm /workspace/private",
    );
    for other in [&forks[1], origin] {
        assert_eq!(
            sh(
                d,
                a,
                other,
                "test ! -e /workspace/proj/f1 && test ! -e /tmp/t1 && cat /workspace/private"
            ),
            "secret\n",
            "{other} sees a fork's writes"
        );
    }
    h.clean(&forks.iter().collect::<Vec<_>>());
}

#[test]
fn root_a_restore_makes_a_host_sessions_tmp_and_workspace_the_snapshots_again() {
    require_root!();
    let h = host_snapshot();
    let HostSnapshot {
        d,
        a,
        origin,
        snap_id,
        ..
    } = &h;
    // Restore: the original's /tmp and /workspace are the snapshot's again.
    sh(
        d,
        a,
        origin,
        "echo later > /workspace/later && rm -r /workspace/proj/sub && echo changed > /tmp/t/f",
    );
    let (status, restored) = restore(d, a, origin, &json!(snap_id));
    assert_eq!(status, 200, "{restored}");
    assert_eq!(sid(&restored), *origin);
    assert_eq!(sh(d, a, origin, HOST_STATE), h.before);
    h.clean(&[]);
}

#[test]
fn root_another_tenant_neither_sees_nor_starts_from_a_snapshot() {
    require_root!();
    let h = host_snapshot();
    let HostSnapshot { d, b, snap_id, .. } = &h;
    let (status, body) = d.request("GET", &format!("/v1/snapshots/{snap_id}"), Some(b), None);
    assert_eq!((status, error_code(&body)), (404, "not_found"), "{body}");
    let (status, body) = d.request(
        "POST",
        "/v1/sessions",
        Some(b),
        Some(json!({"snapshot": snap_id})),
    );
    assert_eq!((status, error_code(&body)), (404, "not_found"), "{body}");
    assert_eq!(session_count(d, b), 0);
    h.clean(&[]);
}

#[test]
fn root_a_fork_or_restore_whose_disk_cannot_hold_a_host_snapshot_is_refused_whole() {
    require_root!();
    let h = host_snapshot();
    let HostSnapshot { d, a, snap_id, .. } = &h;
    // A fork whose disk cannot hold the snapshot is refused whole: nothing is left.
    let sessions = session_count(d, a);
    let (status, body) = d.request(
        "POST",
        "/v1/sessions",
        Some(a),
        Some(json!({"snapshot": snap_id, "limits": {"disk": "2M"}})),
    );
    assert_eq!(
        (status, error_code(&body)),
        (422, "invalid_request"),
        "{body}"
    );
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("do not fit") && message.contains("limits.disk"),
        "{message}"
    );
    assert_eq!(session_count(d, a), sessions);
    // ... and so is a restore, which leaves the session as it was.
    let small = sid(&create(d, a, json!({"limits": {"disk": "2M"}})));
    sh(d, a, &small, "echo mine > /workspace/mine");
    let (status, body) = restore(d, a, &small, &json!(snap_id));
    assert_eq!(
        (status, error_code(&body)),
        (422, "invalid_request"),
        "{body}"
    );
    assert_eq!(sh(d, a, &small, "cat /workspace/mine"), "mine\n");
    h.clean(&[&small]);
}

#[test]
fn root_a_deleted_host_snapshots_forks_keep_their_copies() {
    require_root!();
    let h = host_snapshot();
    let fork = h.fork();
    // One storage, one delete path; forks keep their copies.
    h.clean(&[]);
    assert_eq!(
        sh(&h.d, &h.a, &fork, "cat /workspace/proj/sub/a.txt"),
        "hello\n"
    );
    delete_session(&h.d, &h.a, &fork);
}

/// The brig cgroups beside a session's (every controller's parent of its leaves)
/// that hold no process: what a sandbox that failed to start would leave behind.
fn empty_brig_cgroups(session: &Value) -> BTreeSet<PathBuf> {
    let mut found = BTreeSet::new();
    for leaf in leaves_of(session) {
        let Some(parent) = Path::new(&leaf).parent() else {
            continue;
        };
        for entry in std::fs::read_dir(parent).unwrap().flatten() {
            let path = entry.path();
            let ours = entry.file_name().to_string_lossy().starts_with("brig-");
            let procs = std::fs::read_to_string(path.join("cgroup.procs")).unwrap_or_default();
            if ours && path.is_dir() && procs.trim().is_empty() {
                found.insert(path);
            }
        }
    }
    found
}

/// A fork or restore of a host snapshot copies its files into tmpfs, which the new
/// sandbox's memory pays for: one whose memory cannot hold them is refused whole
/// (422, nothing started or left), as one whose disk cannot is, even when its disk
/// could hold them.
#[test]
fn root_host_snapshot_larger_than_a_forks_memory_is_refused_whole() {
    require_root!();
    let d = daemon(&[]);
    let key = d.admin_key().to_string();
    let origin = create(&d, &key, json!({}));
    let origin_id = sid(&origin);
    sh(
        &d,
        &key,
        &origin_id,
        "head -c 48000000 /dev/urandom > /workspace/big && echo small > /tmp/small",
    );
    let (status, snap) = take_snapshot(&d, &key, &origin_id);
    assert_eq!(status, 201, "{snap}");
    let snap_id = snap["snapshot_id"].as_str().unwrap().to_string();
    // Room on disk, not in memory.
    let limits = json!({"memory": "32M", "disk": "256M"});
    let small = sid(&create(&d, &key, json!({"limits": limits})));
    sh(&d, &key, &small, "echo mine > /workspace/mine");
    let sandboxes_before = sandboxes(&d);
    let empty_before = empty_brig_cgroups(&origin);
    let sessions = session_count(&d, &key);
    let refused = |status: u16, body: &Value| {
        assert_eq!(
            (status, error_code(body)),
            (422, "invalid_request"),
            "{body}"
        );
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("do not fit in the sandbox's memory")
                && message.contains("limits.memory"),
            "{message}"
        );
    };
    let (status, body) = d.request(
        "POST",
        "/v1/sessions",
        Some(&key),
        Some(json!({"snapshot": snap_id, "limits": limits})),
    );
    refused(status, &body);
    assert_eq!(session_count(&d, &key), sessions);
    // A restore is refused the same way and leaves the session as it was.
    let (status, body) = restore(&d, &key, &small, &json!(snap_id));
    refused(status, &body);
    assert_eq!(sh(&d, &key, &small, "cat /workspace/mine"), "mine\n");
    assert_eq!(
        sandboxes(&d),
        sandboxes_before,
        "a refused start left a sandbox"
    );
    assert!(
        common::eventually(5_000, || empty_brig_cgroups(&origin)
            .is_subset(&empty_before)),
        "a refused start left a cgroup: {:?}",
        empty_brig_cgroups(&origin)
    );
    // With the memory, the same fork starts and has the files.
    let fork = sid(&create(
        &d,
        &key,
        json!({"snapshot": snap_id, "limits": {"memory": "256M", "disk": "256M"}}),
    ));
    assert_eq!(
        sh(
            &d,
            &key,
            &fork,
            "stat -c %s /workspace/big && cat /tmp/small"
        ),
        "48000000\nsmall\n"
    );
    for id in [&origin_id, &small, &fork] {
        delete_session(&d, &key, id);
    }
    let (status, _) = d.request(
        "DELETE",
        &format!("/v1/snapshots/{snap_id}"),
        Some(&key),
        None,
    );
    assert_eq!(status, 204);
}

/// A session can be snapshotted any number of times, on the host's dirs and on an
/// image, before and after a restore: each snapshot holds the files of its moment.
#[test]
fn root_a_session_is_snapshotted_again_and_again() {
    require_root!();
    let d = daemon(&[]);
    let key = d.admin_key().to_string();
    import_tiny_image(&d, "tiny");
    let write = |id: &str, path: &str, text: &str| {
        let (status, body) = d.raw(
            "PUT",
            &files_url(id, path),
            Some(&key),
            None,
            Some(text.as_bytes().to_vec()),
        );
        assert!(status == 201 || status == 200, "{status} {body:?}");
    };
    let read = |id: &str, path: &str| {
        let (status, body) = d.raw("GET", &files_url(id, path), Some(&key), None, None);
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        String::from_utf8(body).unwrap()
    };
    for (create_body, path) in [
        (json!({}), "/workspace/state"),
        (json!({"image": "tiny"}), "/etc/state"),
    ] {
        let origin = sid(&create(&d, &key, create_body.clone()));
        let mut snapshots = Vec::new();
        for n in 1..=3 {
            write(&origin, path, &n.to_string());
            let (status, snap) = take_snapshot(&d, &key, &origin);
            assert_eq!(status, 201, "snapshot {n} of {create_body}: {snap}");
            snapshots.push(snap);
        }
        for (n, snap) in snapshots.iter().enumerate() {
            let fork = sid(&create(&d, &key, json!({"snapshot": snap["snapshot_id"]})));
            assert_eq!(read(&fork, path), (n + 1).to_string(), "{create_body}");
            delete_session(&d, &key, &fork);
        }
        // Restored to the first, then snapshotted again.
        let (status, body) = restore(&d, &key, &origin, &json!(snapshots[0]["snapshot_id"]));
        assert_eq!(status, 200, "{body}");
        assert_eq!(read(&origin, path), "1");
        write(&origin, path, "4");
        for _ in 0..2 {
            let (status, snap) = take_snapshot(&d, &key, &origin);
            assert_eq!(status, 201, "a snapshot after a restore: {snap}");
            let fork = sid(&create(&d, &key, json!({"snapshot": snap["snapshot_id"]})));
            assert_eq!(read(&fork, path), "4");
            delete_session(&d, &key, &fork);
            snapshots.push(snap);
        }
        for snap in &snapshots {
            delete_snapshot(&d, &key, snap);
        }
        delete_session(&d, &key, &origin);
    }
}

/// Deleting a snapshot while sessions are being started or restored from it: each
/// start either succeeds (and its session has the snapshot's files) or is 404, never
/// a 500 (before the fix, a start that had found the snapshot could lose its image
/// midway: 1 run in 5 failed here); the delete waits for the starts that got in
/// first and succeeds; and the sessions that did start run on without it.
#[test]
fn root_a_snapshot_deleted_while_sessions_start_from_it_fails_nothing_else() {
    require_root!();
    let d = daemon(&[]);
    let key = d.admin_key().to_string();
    import_tiny_image(&d, "tiny");
    for (create_body, path) in [
        (json!({}), "/workspace/state"),
        (json!({"image": "tiny"}), "/etc/state"),
    ] {
        let origin = sid(&create(&d, &key, create_body.clone()));
        let target = sid(&create(&d, &key, create_body.clone()));
        let (status, body) = d.raw(
            "PUT",
            &files_url(&origin, path),
            Some(&key),
            None,
            Some(b"kept".to_vec()),
        );
        assert!(status == 201 || status == 200, "{status} {body:?}");
        for round in 0..24 {
            let (status, snap) = take_snapshot(&d, &key, &origin);
            assert_eq!(status, 201, "{snap}");
            let snap_id = snap["snapshot_id"].as_str().unwrap().to_string();
            let (starts, deleted) = std::thread::scope(|scope| {
                let forks: Vec<_> = (0..4)
                    .map(|_| {
                        scope.spawn(|| {
                            d.request(
                                "POST",
                                "/v1/sessions",
                                Some(&key),
                                Some(json!({"snapshot": snap_id})),
                            )
                        })
                    })
                    .collect();
                let restore = scope.spawn(|| restore(&d, &key, &target, &json!(snap_id)));
                // Staggered over the rounds: before, during and after the starts.
                std::thread::sleep(Duration::from_micros(round * 500));
                let deleted = d.request(
                    "DELETE",
                    &format!("/v1/snapshots/{snap_id}"),
                    Some(&key),
                    None,
                );
                let mut starts: Vec<(u16, Value)> =
                    forks.into_iter().map(|f| f.join().unwrap()).collect();
                starts.push(restore.join().unwrap());
                (starts, deleted)
            });
            for (status, body) in &starts {
                assert!(
                    *status == 201 || *status == 200 || *status == 404,
                    "round {round} of {create_body}: a start answered {status} {body}"
                );
            }
            let (status, body) = &deleted;
            assert_eq!(*status, 204, "round {round} of {create_body}: {body}");
            assert!(!snapshot_ids(&d, &key).contains(&snap_id));
            for (status, body) in &starts {
                // A fork, or the restored session.
                let started = match status {
                    201 => sid(body),
                    200 => target.clone(),
                    _ => continue,
                };
                let (status, text) =
                    d.raw("GET", &files_url(&started, path), Some(&key), None, None);
                assert_eq!((status, &text[..]), (200, &b"kept"[..]), "{body}");
                if started != target {
                    delete_session(&d, &key, &started);
                }
            }
        }
        delete_session(&d, &key, &target);
        delete_session(&d, &key, &origin);
    }
}

/// Concurrent deletes of one snapshot: one is 204, the others 404, never a 500 (two
/// deletes raced to remove its image), and the snapshot is gone with its image.
#[test]
fn root_concurrent_deletes_of_a_snapshot_are_one_204_and_404s() {
    require_root!();
    let d = daemon(&[]);
    let key = d.admin_key().to_string();
    let id = sid(&create(&d, &key, json!({})));
    sh(&d, &key, &id, "echo hi > /workspace/a");
    let images_before = store_contents(&d).0;
    for round in 0..10 {
        let (status, snap) = take_snapshot(&d, &key, &id);
        assert_eq!(status, 201, "{snap}");
        let path = format!("/v1/snapshots/{}", snap["snapshot_id"].as_str().unwrap());
        let answers: Vec<(u16, Value)> = std::thread::scope(|scope| {
            let deletes: Vec<_> = (0..6)
                .map(|_| scope.spawn(|| d.request("DELETE", &path, Some(&key), None)))
                .collect();
            deletes.into_iter().map(|t| t.join().unwrap()).collect()
        });
        let mut statuses: Vec<u16> = answers.iter().map(|(status, _)| *status).collect();
        statuses.sort();
        assert_eq!(
            statuses,
            [204, 404, 404, 404, 404, 404],
            "round {round}: {answers:?}"
        );
        assert!(snapshot_ids(&d, &key).is_empty());
        assert_eq!(store_contents(&d).0, images_before, "round {round}");
    }
    delete_session(&d, &key, &id);
}

/// A daemon killed between packing a snapshot's image and recording its row (or
/// between deleting a snapshot's row and its image) leaves an image that no snapshot
/// names: in no tenant's quota, and kept by `brig image gc` (an image references
/// its layer). The next start removes it with its layer, and nothing else: not a
/// recorded snapshot's image, nor a `snap-` image this daemon never listed as its
/// own (the store may be shared).
#[test]
fn root_snapshot_images_a_killed_daemon_left_unrecorded_are_removed_at_start() {
    require_root!();
    let dir = tempfile::Builder::new()
        .prefix("orphan-snapshot-")
        .tempdir()
        .unwrap();
    let (data, store) = (dir.path().join("data"), dir.path().join("store"));
    let args = ["--default-image", "host"];
    let mut d = Daemon::start_in(&data, &store, &args);
    let key = d.admin_key().to_string();
    let id = sid(&create(&d, &key, json!({})));
    sh(&d, &key, &id, "echo kept > /workspace/a");
    let (status, kept) = take_snapshot(&d, &key, &id);
    assert_eq!(status, 201, "{kept}");
    sh(&d, &key, &id, "echo orphan > /workspace/a");
    let (status, orphan) = take_snapshot(&d, &key, &id);
    assert_eq!(status, 201, "{orphan}");
    let image_of = |snapshot: &Value| {
        let id = snapshot["snapshot_id"].as_str().unwrap();
        format!("snap-{}", id.trim_start_matches("snap_"))
    };
    let record = |image: &str| -> Value {
        let path = store.join("images").join(format!("{image}.json"));
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
    };
    let layer_file = |digest: &Value| {
        let hex = digest.as_str().unwrap().trim_start_matches("sha256:");
        store.join("layers").join(format!("{hex}.erofs"))
    };
    let (kept_image, orphan_image) = (image_of(&kept), image_of(&orphan));
    let orphan_layer = layer_file(&record(&orphan_image)["layers"][0]);
    assert!(orphan_layer.exists());
    // Another's snapshot image in a shared store, unknown to this daemon.
    let mut foreign = record(&kept_image);
    let foreign_image = "snap-0123456789abcdef01234567";
    foreign["name"] = json!(foreign_image);
    std::fs::write(
        store.join("images").join(format!("{foreign_image}.json")),
        serde_json::to_vec(&foreign).unwrap(),
    )
    .unwrap();
    d.stop();
    // What a daemon killed right after packing `orphan` leaves (or right after
    // deleting its row): the image, listed as being worked on, and no row. `kept` is
    // listed too, as when the daemon died right after recording it.
    {
        let conn = rusqlite::Connection::open(data.join("brig.db")).unwrap();
        let orphan_id = orphan["snapshot_id"].as_str().unwrap();
        conn.execute("DELETE FROM snapshots WHERE id = ?1", [orphan_id])
            .unwrap();
        conn.execute(
            "DELETE FROM snapshot_layers WHERE snapshot_id = ?1",
            [orphan_id],
        )
        .unwrap();
        for image in [&orphan_image, &kept_image] {
            conn.execute(
                "INSERT INTO snapshot_images (image, since) VALUES (?1, '2020-01-01T00:00:00.000Z')",
                [image],
            )
            .unwrap();
        }
    }
    drop(d);
    let d = Daemon::start_in(&data, &store, &args);
    d.remember_key(&key);
    let images: BTreeSet<String> = std::fs::read_dir(store.join("images"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        !images.contains(&format!("{orphan_image}.json")),
        "{images:?}"
    );
    assert!(!orphan_layer.exists(), "the orphan's layer is left");
    assert!(images.contains(&format!("{kept_image}.json")), "{images:?}");
    assert!(
        images.contains(&format!("{foreign_image}.json")),
        "{images:?}"
    );
    let listed: i64 = rusqlite::Connection::open(data.join("brig.db"))
        .unwrap()
        .query_row("SELECT COUNT(*) FROM snapshot_images", [], |row| row.get(0))
        .unwrap();
    assert_eq!(listed, 0);
    // The session and the recorded snapshot are untouched.
    assert_eq!(sh(&d, &key, &id, "cat /workspace/a"), "orphan\n");
    let fork = sid(&create(&d, &key, json!({"snapshot": kept["snapshot_id"]})));
    assert_eq!(sh(&d, &key, &fork, "cat /workspace/a"), "kept\n");
    delete_session(&d, &key, &fork);
    delete_session(&d, &key, &id);
    delete_snapshot(&d, &key, &kept);
    drop(d);
    std::fs::remove_file(store.join("images").join(format!("{foreign_image}.json"))).unwrap();
    let gc = common::brig()
        .args(["image", "gc", "--unmount", "--store"])
        .arg(&store)
        .output()
        .unwrap();
    assert!(gc.status.success(), "{gc:?}");
}

#[test]
fn root_one_tenants_slow_forks_do_not_hold_up_another_tenants_creates() {
    require_root!();
    let d = daemon(&[]);
    let (a, _) = tenant_key(&d, "forker");
    let (b, _) = tenant_key(&d, "bystander");
    let origin = sid(&create(&d, &a, json!({})));
    // A host snapshot's fork copies its files in as it starts, in its launch.
    sh(
        &d,
        &a,
        &origin,
        "head -c 100000000 /dev/urandom > /workspace/noise",
    );
    let (status, snap) = take_snapshot(&d, &a, &origin);
    assert_eq!(status, 201, "{snap}");
    // How long forks take is the machine's: more of them at once (on a few cores, each
    // then copies more slowly) until one is seen in flight from before the other
    // tenant's create starts until after it ends. A create that waited for the
    // creates in flight could never be seen so, and fails here.
    let took = [2, 4, 8]
        .into_iter()
        .find_map(|forks| create_while_forks_run(&d, &a, &b, &snap, forks))
        .expect("no fork was seen in flight across the other tenant's create");
    // Its own latency: a create takes well under a second, here with the forks'
    // copies sharing the machine's cores.
    assert!(
        took < Duration::from_secs(30),
        "the other tenant's create took {took:?} while the forks ran"
    );
    delete_session(&d, &a, &origin);
    delete_snapshot(&d, &a, &snap);
}

/// Tenant `b` creates a session while `forks` forks of `a`'s `snap` are launching:
/// how long that took, or None unless a fork was in flight all the while.
fn create_while_forks_run(
    d: &Daemon,
    a: &str,
    b: &str,
    snap: &Value,
    forks: usize,
) -> Option<Duration> {
    std::thread::scope(|scope| {
        let threads: Vec<_> = (0..forks)
            .map(|_| {
                scope.spawn(|| {
                    d.request(
                        "POST",
                        "/v1/sessions",
                        Some(a),
                        Some(json!({"snapshot": snap["snapshot_id"], "limits": {"memory": "1G"}})),
                    )
                })
            })
            .collect();
        // A fork is in flight while its launch helper runs: the daemon answers the
        // create when the helper has exited.
        let deadline = Instant::now() + Duration::from_secs(120);
        let helpers = loop {
            let helpers = launch_helpers(d);
            if helpers.len() == forks || threads.iter().any(|t| t.is_finished()) {
                break Some(helpers).filter(|h| !h.is_empty());
            }
            assert!(Instant::now() < deadline, "the forks never launched");
            std::thread::sleep(Duration::from_millis(2));
        };
        let outcome = helpers.map(|helpers| {
            let started = Instant::now();
            let bystander = sid(&create(d, b, json!({})));
            let took = started.elapsed();
            let still = launch_helpers(d);
            delete_session(d, b, &bystander);
            (!helpers.is_disjoint(&still), took)
        });
        for thread in threads {
            let (status, fork) = thread.join().unwrap();
            assert_eq!(status, 201, "{fork}");
            delete_session(d, a, &sid(&fork));
        }
        eprintln!("{forks} forks: (one in flight throughout, create took) = {outcome:?}");
        match outcome {
            Some((true, took)) => Some(took),
            _ => None,
        }
    })
}

/// The daemon's launch helpers running now: the live children of its zygote.
fn launch_helpers(d: &Daemon) -> BTreeSet<u32> {
    let live_children = |pid: u32| -> Vec<u32> {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return Vec::new();
        };
        let mut found = Vec::new();
        for task in tasks.flatten() {
            let children =
                std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            for child in children
                .split_whitespace()
                .filter_map(|c| c.parse::<u32>().ok())
            {
                let stat =
                    std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap_or_default();
                // The state follows the command's name, which may hold anything but ')'.
                if stat
                    .rsplit_once(") ")
                    .is_some_and(|(_, rest)| !rest.starts_with('Z'))
                {
                    found.push(child);
                }
            }
        }
        found
    };
    live_children(d.pid())
        .into_iter()
        .filter(|pid| common::daemon::is_zygote(*pid))
        .flat_map(live_children)
        .collect()
}

#[test]
fn root_a_deleted_snapshots_layer_goes_when_the_last_session_using_it_ends() {
    require_root!();
    let d = daemon(&[]);
    let (key, _) = tenant_key(&d, "leak");
    import_tiny_image(&d, "tiny");
    let store_before = store_contents(&d);
    let origin = sid(&create(&d, &key, json!({"image": "tiny"})));
    let noise = noise(7, 5_000_000);
    let (status, _) = d.raw(
        "PUT",
        &files_url(&origin, "/workspace/noise"),
        Some(&key),
        None,
        Some(noise.clone()),
    );
    assert_eq!(status, 201);
    let (status, snap) = take_snapshot(&d, &key, &origin);
    assert_eq!(status, 201, "{snap}");
    let fork = sid(&create(&d, &key, json!({"snapshot": snap["snapshot_id"]})));
    let restored = sid(&create(&d, &key, json!({"image": "tiny"})));
    let (status, body) = restore(&d, &key, &restored, &json!(snap["snapshot_id"]));
    assert_eq!(status, 200, "{body}");
    // Deleted while two sessions run from it: its layer stays while they use it...
    delete_snapshot(&d, &key, &snap);
    let (_, layers) = store_contents(&d);
    let held: Vec<&String> = layers.difference(&store_before.1).collect();
    assert_eq!(held.len(), 1, "{layers:?}");
    let held_hex = held[0].trim_end_matches(".erofs").to_string();
    let mounted = || std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(mounted().contains(&held_hex));
    let (status, read) = d.raw(
        "GET",
        &files_url(&fork, "/workspace/noise"),
        Some(&key),
        None,
        None,
    );
    assert_eq!((status, read == noise), (200, true));
    delete_session(&d, &key, &fork);
    assert_eq!(store_contents(&d).1.len(), store_before.1.len() + 1);
    // ...and goes with the last one (here replaced by a restore to its image).
    let (status, body) = restore(&d, &key, &restored, &json!("snap_nope"));
    assert_eq!(status, 404, "{body}");
    delete_session(&d, &key, &restored);
    assert_eq!(store_contents(&d), store_before);
    delete_session(&d, &key, &origin);
    assert_eq!(store_contents(&d), store_before);
    assert!(!mounted().contains(&held_hex));
}

/// A symlink in a host session's /tmp or /workspace is data: neither the snapshot
/// (which reads those directories from the host) nor a fork (which fills new ones
/// from it) follows it to a host file.
#[test]
fn root_symlinks_in_a_host_snapshot_never_reach_the_host() {
    require_root!();
    let d = daemon(&[]);
    let key = d.admin_key().to_string();
    let canary = tempfile::tempdir().unwrap();
    let secret = canary.path().join("secret");
    std::fs::write(&secret, "host secret\n").unwrap();
    let listing = |dir: &Path| {
        let mut names: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        names
    };
    let stamp = |path: &Path| {
        let meta = std::fs::symlink_metadata(path).unwrap();
        (
            meta.len(),
            meta.modified().unwrap(),
            std::fs::read(path).ok(),
        )
    };
    let watched = [
        Path::new("/etc/shadow"),
        Path::new("/etc/passwd"),
        secret.as_path(),
    ];
    let before: Vec<_> = watched.iter().map(|p| stamp(p)).collect();
    let canary_before = listing(canary.path());

    let origin = sid(&create(&d, &key, json!({})));
    let dir = canary.path().display();
    sh(
        &d,
        &key,
        &origin,
        &format!(
            "ln -s /etc/shadow /workspace/evil && ln -s ../../.. /workspace/up \
             && ln -s {dir}/secret /workspace/canary && ln -s {dir} /tmp/canary_dir \
             && ln -s /etc /workspace/etc && mkdir /workspace/d && ln -s / /workspace/d/root"
        ),
    );
    let (status, snap) = take_snapshot(&d, &key, &origin);
    assert_eq!(status, 201, "{snap}");
    let snap_id = snap["snapshot_id"].as_str().unwrap().to_string();
    let fork = sid(&create(&d, &key, json!({"snapshot": snap_id})));
    // The links came over as links, with their targets as written.
    assert_eq!(
        sh(
            &d,
            &key,
            &fork,
            "cd /workspace && for l in evil up canary /tmp/canary_dir etc d/root; do \
             printf '%s -> %s\\n' $l \"$(readlink $l)\"; test -L $l || echo not-a-link; done"
        ),
        format!(
            "evil -> /etc/shadow\nup -> ../../..\ncanary -> {dir}/secret\n\
             /tmp/canary_dir -> {dir}\netc -> /etc\nd/root -> /\n"
        )
    );
    // Read through the files API, they resolve inside the fork: no host file.
    let (status, _) = d.raw(
        "GET",
        &files_url(&fork, "/workspace/canary"),
        Some(&key),
        None,
        None,
    );
    assert_eq!(status, 404);
    // A restore goes the same way.
    let (status, body) = restore(&d, &key, &origin, &json!(snap_id));
    assert_eq!(status, 200, "{body}");
    // Nothing on the host was read into the layer or written.
    let after: Vec<_> = watched.iter().map(|p| stamp(p)).collect();
    assert_eq!(before, after, "a host file changed");
    assert_eq!(
        listing(canary.path()),
        canary_before,
        "something was made in the canary dir"
    );
    let layer_has_secret = std::process::Command::new("grep")
        .args(["-rqa", "host secret"])
        .arg(d.store().join("layers"))
        .status()
        .unwrap()
        .success();
    assert!(
        !layer_has_secret,
        "the host file's contents went into a layer"
    );
    for id in [&origin, &fork] {
        delete_session(&d, &key, id);
    }
    let (status, _) = d.request(
        "DELETE",
        &format!("/v1/snapshots/{snap_id}"),
        Some(&key),
        None,
    );
    assert_eq!(status, 204);
}
