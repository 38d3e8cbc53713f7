//! Stored files (`/v1/files`) and the bundles mounted from them.

use std::path::Path;
use std::time::Duration;

use crate::common;
use crate::common::daemon::Daemon;
use crate::support::{
    create, daemon, delete_session, exec, files_url, import_tiny_image, mountinfo_line, restore,
    session_count, set_disk_quota, sh, sid, take_snapshot, tar_end, tar_entry, tenant_key,
    tool_bundle, upload_file,
};
use serde_json::json;

/// A bundle's extracted copy is disk the tenant takes for as long as it keeps the
/// file, so its quota counts it: a tar of empty directories (512 bytes each in the
/// tar, a 4 KiB block each on disk) used to unpack to 8 times what the quota
/// counted. Past the room the quota leaves, the create is 429 and leaves nothing;
/// with room, `file_bytes` grows by what the copy takes, and the copy takes no
/// more than that.
#[test]
fn root_a_bundles_extracted_copy_counts_in_the_disk_quota() {
    require_root!();
    let d = daemon(&[]);
    let (key, _) = tenant_key(&d, "amp");
    let dirs = 2000;
    let mut tar = Vec::new();
    for i in 0..dirs {
        tar_entry(
            &mut tar,
            &format!("d{i:05}/"),
            tar::EntryType::Directory,
            "",
            b"",
        );
    }
    tar_end(&mut tar);
    let charged = |n: u64| n.div_ceil(4096).max(1) * 4096;
    let (tar_bytes, blocks) = (charged(tar.len() as u64), (dirs + 1) * 4096);
    let disk = 16u64 << 20;
    // Room for the tar and the session's disk, and 4 MB more: not for the 8 MB copy.
    set_disk_quota(&d, "amp", disk + tar_bytes + (4 << 20));
    let file = upload_file(&d, &key, "dirs.tar", &tar);
    let body = json!({"limits": {"disk": disk}, "mounts": [{"file_id": file, "path": "/opt/b"}]});
    let (status, r) = d.request("POST", "/v1/sessions", Some(&key), Some(body.clone()));
    assert_eq!(status, 429, "{r}");
    assert_eq!(r["error"]["code"], "quota_exceeded", "{r}");
    let files = d.data_dir().join("files/amp");
    let left: Vec<_> = std::fs::read_dir(&files)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(left, std::slice::from_ref(&file), "only the tar is left");
    let usage =
        |d: &Daemon| d.request("GET", "/v1/tenants/amp", Some(&key), None).1["usage"].clone();
    assert_eq!(usage(&d)["file_bytes"], tar_bytes);
    assert_eq!(usage(&d)["sessions"], 0);

    set_disk_quota(&d, "amp", disk + tar_bytes + (16 << 20));
    let id = sid(&create(&d, &key, body));
    assert_eq!(sh(&d, &key, &id, "ls /opt/b | wc -l"), format!("{dirs}\n"));
    // Each entry counts at least a block, and its name in its directory.
    let counted = usage(&d)["file_bytes"].as_u64().unwrap() - tar_bytes;
    assert!(
        (blocks..blocks + dirs * 64).contains(&counted),
        "{counted} counted for {blocks} bytes of blocks"
    );
    let taken = disk_taken(&files.join(format!("{file}.bundle")));
    assert!(
        taken <= counted,
        "the copy takes {taken} bytes, {counted} counted"
    );
    delete_session(&d, &key, &id);
    // Deleting the file frees both.
    let (status, _) = d.request("DELETE", &format!("/v1/files/{file}"), Some(&key), None);
    assert_eq!(status, 204);
    assert_eq!(usage(&d)["file_bytes"], 0);
}

/// The disk a tree takes: its entries' allocated blocks.
fn disk_taken(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::symlink_metadata(path).unwrap();
    let mut total = meta.blocks() * 512;
    if meta.is_dir() {
        for entry in std::fs::read_dir(path).unwrap() {
            total += disk_taken(&entry.unwrap().path());
        }
    }
    total
}

/// Each entry type of a bundle comes out as docs/API.md says: a hard link to a
/// regular file earlier in the archive is a link to it (it used to be left out:
/// the file was simply missing), symlinks are kept as symlinks, fifos are left
/// out; a hard link to anything else refuses the bundle (422), leaving nothing.
#[test]
fn root_bundle_entries_come_out_as_documented() {
    require_root!();
    let d = daemon(&[]);
    let key = d.admin_key().to_string();
    let mut tar = Vec::new();
    tar_entry(&mut tar, "a/f", tar::EntryType::Regular, "", b"hello\n");
    tar_entry(&mut tar, "b/g", tar::EntryType::Link, "a/f", b"");
    tar_entry(&mut tar, "a/s", tar::EntryType::Symlink, "f", b"");
    tar_entry(&mut tar, "a/p", tar::EntryType::Fifo, "", b"");
    tar_end(&mut tar);
    let file = upload_file(&d, &key, "links.tar", &tar);
    let id = sid(&create(
        &d,
        &key,
        json!({"mounts": [{"file_id": file, "path": "/opt/b"}]}),
    ));
    assert_eq!(
        sh(
            &d,
            &key,
            &id,
            "cat /opt/b/b/g; stat -c %h /opt/b/a/f; readlink /opt/b/a/s; cat /opt/b/a/s; \
             test -e /opt/b/a/p || echo no fifo"
        ),
        "hello\n2\nf\nhello\nno fifo\n"
    );
    delete_session(&d, &key, &id);

    for (what, target) in [
        ("a missing file", "nowhere"),
        ("a later file", "c/late"),
        ("a directory", "a"),
        ("a symlink", "a/s"),
        ("outside", "../../etc/passwd"),
    ] {
        let mut tar = Vec::new();
        tar_entry(&mut tar, "a/", tar::EntryType::Directory, "", b"");
        tar_entry(&mut tar, "a/s", tar::EntryType::Symlink, "/etc/passwd", b"");
        tar_entry(&mut tar, "c/link", tar::EntryType::Link, target, b"");
        tar_entry(&mut tar, "c/late", tar::EntryType::Regular, "", b"late\n");
        tar_end(&mut tar);
        let file = upload_file(&d, &key, "bad.tar", &tar);
        let (status, r) = d.request(
            "POST",
            "/v1/sessions",
            Some(&key),
            Some(json!({"mounts": [{"file_id": file, "path": "/opt/b"}]})),
        );
        assert_eq!(status, 422, "{what}: {r}");
        assert_eq!(r["error"]["code"], "invalid_request", "{what}: {r}");
        let message = r["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("c/link: a hard link to"),
            "{what}: {message}"
        );
        assert!(
            !d.data_dir()
                .join(format!("files/admin/{file}.bundle"))
                .exists(),
            "{what}"
        );
    }
    let (_, sessions) = d.request("GET", "/v1/sessions", Some(&key), None);
    assert_eq!(sessions["sessions"], json!([]));
}

#[test]
fn root_bundles_mount_read_only() {
    require_root!();
    let d = daemon(&[]);
    let key = d.admin_key().to_string();
    let file = upload_file(&d, &key, "bundle.tar", &tool_bundle());
    let s = create(
        &d,
        &key,
        json!({"mounts": [{"file_id": file, "path": "/opt/bundle"}]}),
    );
    assert_eq!(
        s["mounts"],
        json!([{"file_id": file, "path": "/opt/bundle"}]),
        "{s}"
    );
    let id = sid(&s);
    assert_eq!(
        sh(&d, &key, &id, "python3 /opt/bundle/lib/tool.py"),
        "from the bundle\n"
    );
    // Read-only, nosuid, nodev: nothing in it can be changed from inside.
    let line = mountinfo_line(&d, &key, &id, "/opt/bundle");
    let options = line.split(' ').nth(5).unwrap();
    for option in ["ro", "nosuid", "nodev"] {
        assert!(options.split(',').any(|o| o == option), "{line}");
    }
    let r = exec(
        &d,
        &key,
        &id,
        json!({"cmd": "echo x > /opt/bundle/lib/new; echo x >> /opt/bundle/lib/tool.py; \
                        rm -f /opt/bundle/lib/tool.py; chmod 777 /opt/bundle/lib; \
                        mv /opt/bundle/lib /opt/bundle/moved; \
                        test -e /opt/bundle/lib/new || test -e /opt/bundle/moved"}),
    );
    assert_ne!(r["exit_code"], 0, "the bundle is writable: {r}");
    let (status, _) = d.raw(
        "PUT",
        &files_url(&id, "/opt/bundle/lib/new"),
        Some(&key),
        None,
        Some(b"x".to_vec()),
    );
    assert!(
        (400..500).contains(&status),
        "the API wrote into the bundle: {status}"
    );
    // Another session sees the same, unchanged bundle (here twice, once inside its
    // workspace, where an agent's skills would go).
    let other = sid(&create(
        &d,
        &key,
        json!({"mounts": [
            {"file_id": file, "path": "/opt/bundle"},
            {"file_id": file, "path": "/workspace/skills/tool"},
        ]}),
    ));
    assert_eq!(
        sh(
            &d,
            &key,
            &other,
            "cat /opt/bundle/lib/tool.py; ls /opt/bundle/lib; stat -c %a /opt/bundle/lib; \
             cat skills/tool/lib/tool.py"
        ),
        "print('from the bundle')\ntool.py\n755\nprint('from the bundle')\n"
    );
    // Bad mounts: unknown file, relative path, reserved targets (what brig builds
    // itself, and /volume), a path with `..`: nothing is created.
    let before = session_count(&d, &key);
    for mount in [
        json!({"file_id": "0123456789abcdef0123456789abcdef", "path": "/opt/x"}),
        json!({"file_id": "../../admin.key", "path": "/opt/x"}),
        json!({"file_id": file, "path": "relative"}),
        json!({"file_id": file, "path": "/opt/../etc"}),
        json!({"file_id": file, "path": "/"}),
        json!({"file_id": file, "path": "/proc/x"}),
        json!({"file_id": file, "path": "/dev"}),
        json!({"file_id": file, "path": "/sys"}),
        json!({"file_id": file, "path": "/tmp"}),
        json!({"file_id": file, "path": "/workspace"}),
        json!({"file_id": file, "path": "/volume"}),
        json!({"file_id": file, "path": "/volume/x"}),
    ] {
        let (status, body) = d.request(
            "POST",
            "/v1/sessions",
            Some(&key),
            Some(json!({"mounts": [mount]})),
        );
        assert!(status == 404 || status == 422, "{mount}: {status} {body}");
    }
    let (status, body) = d.request(
        "POST",
        "/v1/sessions",
        Some(&key),
        Some(json!({"mounts": [{"file_id": file, "path": "/opt/a"}, {"file_id": file, "path": "/opt/a/"}]})),
    );
    assert_eq!(status, 422, "the same target twice: {body}");
    assert_eq!(session_count(&d, &key), before);
    // Another tenant's file is unknown to it.
    let (other_key, _) = tenant_key(&d, "other");
    let (status, _) = d.request(
        "POST",
        "/v1/sessions",
        Some(&other_key),
        Some(json!({"mounts": [{"file_id": file, "path": "/opt/b"}]})),
    );
    assert_eq!(status, 404);
    // A mounted file cannot be deleted (its sessions would lose their files).
    let (status, body) = d.request("DELETE", &format!("/v1/files/{file}"), Some(&key), None);
    assert_eq!(status, 409, "{body}");
    assert_eq!(sh(&d, &key, &other, "ls /opt/bundle/lib"), "tool.py\n");
    delete_session(&d, &key, &id);
    delete_session(&d, &key, &other);
    let (status, body) = d.request("DELETE", &format!("/v1/files/{file}"), Some(&key), None);
    assert_eq!(status, 204, "{body}");
}

#[test]
fn root_bundles_follow_snapshots_forks_and_restore() {
    require_root!();
    let d = daemon(&[]);
    let key = d.admin_key().to_string();
    import_tiny_image(&d, "tiny");
    let file = upload_file(&d, &key, "bundle.tar", &tool_bundle());
    let mounts = json!([{"file_id": file, "path": "/opt/bundle"}]);
    let read = |id: &str, path: &str| {
        let (status, body) = d.raw("GET", &files_url(id, path), Some(&key), None, None);
        (status, String::from_utf8_lossy(&body).into_owned())
    };
    let tool = (200, "print('from the bundle')\n".to_string());
    let origin = sid(&create(
        &d,
        &key,
        json!({"image": "tiny", "mounts": mounts}),
    ));
    assert_eq!(read(&origin, "/opt/bundle/lib/tool.py"), tool);
    let (status, _) = d.raw(
        "PUT",
        &files_url(&origin, "/etc/mine"),
        Some(&key),
        None,
        Some(b"mine".to_vec()),
    );
    assert_eq!(status, 201);
    let (status, snap) = take_snapshot(&d, &key, &origin);
    assert_eq!(status, 201, "{snap}");
    assert_eq!(snap["mounts"], mounts, "{snap}");
    let snap_id = snap["snapshot_id"].as_str().unwrap().to_string();
    // The bundle is not part of the snapshot's layer; a fork mounts it again.
    let fork = create(&d, &key, json!({"snapshot": snap_id}));
    assert_eq!(fork["mounts"], mounts, "{fork}");
    let fork = sid(&fork);
    assert_eq!(read(&fork, "/opt/bundle/lib/tool.py"), tool);
    assert_eq!(read(&fork, "/etc/mine"), (200, "mine".to_string()));
    // A fork that names its own mounts gets those (here: none).
    let bare = create(&d, &key, json!({"snapshot": snap_id, "mounts": []}));
    assert_eq!(bare["mounts"], json!([]), "{bare}");
    let bare = sid(&bare);
    assert_eq!(read(&bare, "/opt/bundle/lib/tool.py").0, 404);
    assert_eq!(read(&bare, "/etc/mine"), (200, "mine".to_string()));
    // Restore keeps the session's own mounts.
    let (status, restored) = restore(&d, &key, &origin, &json!(snap_id));
    assert_eq!(status, 200, "{restored}");
    assert_eq!(restored["mounts"], mounts);
    assert_eq!(read(&origin, "/opt/bundle/lib/tool.py"), tool);
    for id in [&origin, &fork, &bare] {
        delete_session(&d, &key, id);
    }
    // Once the file is gone, a fork that would mount it is refused, not started
    // without it.
    let (status, _) = d.request("DELETE", &format!("/v1/files/{file}"), Some(&key), None);
    assert_eq!(status, 204);
    let (status, body) = d.request(
        "POST",
        "/v1/sessions",
        Some(&key),
        Some(json!({"snapshot": snap_id})),
    );
    assert_eq!(status, 404, "{body}");
    assert_eq!(session_count(&d, &key), 0);
    let (status, _) = d.request(
        "DELETE",
        &format!("/v1/snapshots/{snap_id}"),
        Some(&key),
        None,
    );
    assert_eq!(status, 204);
}

#[test]
fn root_mounted_bundles_do_not_expire_under_their_sessions() {
    require_root!();
    let dir = tempfile::Builder::new()
        .prefix("vol-expiry-")
        .tempdir()
        .unwrap();
    let (data, store) = (dir.path().join("data"), dir.path().join("store"));
    let args = ["--default-image", "host", "--file-ttl", "1s"];
    let mut d = Daemon::start_in(&data, &store, &args);
    let key = d.admin_key().to_string();
    let mounted = upload_file(&d, &key, "bundle.tar", &tool_bundle());
    let unused = upload_file(&d, &key, "other.tar", &tool_bundle());
    let id = sid(&create(
        &d,
        &key,
        json!({"mounts": [{"file_id": mounted, "path": "/opt/bundle"}]}),
    ));
    std::thread::sleep(Duration::from_millis(1500));
    // A restart runs the expiry pass at once (then every minute).
    d.stop();
    drop(d);
    let d = Daemon::start_in(&data, &store, &args);
    let files = data.join("files").join("admin");
    assert!(
        common::eventually(60_000, || !files.join(&unused).exists()),
        "the unused file did not expire"
    );
    assert!(files.join(&mounted).exists());
    assert!(files.join(format!("{mounted}.bundle")).is_dir());
    assert_eq!(
        sh(&d, &key, &id, "cat /opt/bundle/lib/tool.py"),
        "print('from the bundle')\n"
    );
    // Expired for everything else: not listed, not mountable by a new session.
    let (status, _) = d.request(
        "POST",
        "/v1/sessions",
        Some(&key),
        Some(json!({"mounts": [{"file_id": mounted, "path": "/opt/b"}]})),
    );
    assert_eq!(status, 404);
    delete_session(&d, &key, &id);
    drop(d);
}
