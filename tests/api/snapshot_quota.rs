//! Snapshots and forks against the disk quota, sparse files included.

use std::time::{Duration, Instant};

use crate::support::{
    create, daemon, delete_session, delete_snapshot, error_code, files_url, import_tiny_image,
    multipart, noise, restore, session_count, set_disk_quota, set_quotas, sh, sid, snapshot_ids,
    store_contents, take_snapshot, tenant_key, tenant_usage, volumes,
};
use serde_json::{json, Value};

#[test]
fn root_sparse_files_cannot_make_a_snapshot_read_more_than_the_quota_allows() {
    require_root!();
    let d = daemon(&[]);
    let (key, _) = tenant_key(&d, "sparse");
    set_quotas(&d, "sparse", json!({"max_disk_bytes": 2u64 << 30}));
    let id = sid(&create(&d, &key, json!({})));
    // The attack: a file of 1 TB that takes no disk, which packing would read whole
    // (half an hour, the session frozen all along). An image session's writes are
    // measured the same way (rootfs unit test claimed_bytes_count_holes).
    sh(&d, &key, &id, "truncate -s 1T /workspace/holes");
    let started = Instant::now();
    let (status, body) = take_snapshot(&d, &key, &id);
    assert_eq!(
        (status, error_code(&body)),
        (429, "quota_exceeded"),
        "{body}"
    );
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("sparse"),
        "{body}"
    );
    // Refused before reading: reading the terabyte would take half an hour.
    assert!(
        started.elapsed() < Duration::from_secs(120),
        "{:?}",
        started.elapsed()
    );
    assert!(snapshot_ids(&d, &key).is_empty());
    // The session runs on, and once the file is gone it can be snapshotted.
    sh(
        &d,
        &key,
        &id,
        "rm /workspace/holes; echo kept > /workspace/small",
    );
    let (status, snap) = take_snapshot(&d, &key, &id);
    assert_eq!(status, 201, "{snap}");
    delete_session(&d, &key, &id);
    delete_snapshot(&d, &key, &snap);
}

#[test]
fn root_a_fork_keeps_the_holes_of_a_snapshots_sparse_files() {
    require_root!();
    let d = daemon(&[]);
    let (key, _) = tenant_key(&d, "holes");
    let id = sid(&create(&d, &key, json!({})));
    // 400 MiB that take a few KiB: a hole, one written byte, a hole; and 4 MiB of
    // zeros really written (they read the same as a hole).
    sh(
        &d,
        &key,
        &id,
        "cd /workspace && truncate -s 400M holes && printf x | dd of=holes bs=1 seek=200000000 conv=notrunc 2>/dev/null \
         && head -c 4194304 /dev/zero > zeros",
    );
    let (status, snap) = take_snapshot(&d, &key, &id);
    assert_eq!(status, 201, "{snap}");
    // Forked into a sandbox whose disk (a tmpfs charged to its memory) is far
    // smaller than the file claims: filled whole, it could not start.
    let fork = create(
        &d,
        &key,
        json!({"snapshot": snap["snapshot_id"], "limits": {"disk": "64M", "memory": "128M"}}),
    );
    let fork_id = sid(&fork);
    let seen = sh(
        &d,
        &key,
        &fork_id,
        "cd /workspace && stat -c '%s %b' holes zeros && dd if=holes bs=1 skip=200000000 count=1 2>/dev/null \
         && cmp -n 200000000 holes /dev/zero && cmp -n 4194304 zeros /dev/zero; echo \" $?\"",
    );
    let mut words = seen.split_whitespace();
    let mut next = || words.next().unwrap_or_default().to_string();
    let (holes_size, holes_blocks, zeros_size, zeros_blocks) = (next(), next(), next(), next());
    assert_eq!(holes_size, (400u64 << 20).to_string(), "{seen}");
    assert_eq!(zeros_size, (4u64 << 20).to_string(), "{seen}");
    // Blocks of 512 bytes: a page or two for the written byte, none for the zeros.
    assert!(holes_blocks.parse::<u64>().unwrap() <= 64, "{seen}");
    assert!(zeros_blocks.parse::<u64>().unwrap() <= 64, "{seen}");
    // The byte is where it was, everything else reads as zeros (cmp stops at the
    // byte, hence the status of the last cmp only).
    assert!(seen.contains('x'), "{seen}");
    assert!(seen.trim_end().ends_with(" 0"), "{seen}");
    // A restore fills the session the same way.
    let (status, restored) = restore(&d, &key, &id, &json!(snap["snapshot_id"]));
    assert_eq!(status, 200, "{restored}");
    let seen = sh(&d, &key, &id, "stat -c '%s %b' /workspace/holes");
    let blocks: u64 = seen.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(
        seen.starts_with(&(400u64 << 20).to_string()) && blocks <= 64,
        "{seen}"
    );
    delete_session(&d, &key, &fork_id);
    delete_session(&d, &key, &id);
    delete_snapshot(&d, &key, &snap);
}

/// A tenant's snapshots count in its disk quota, as its sessions' disks, files and
/// volumes do, wherever the quota is checked: a snapshot beyond it is refused with
/// 429 after packing and leaves nothing (no snapshot, image or layer; the session
/// runs on, or stays paused, as it was), one of a tenant already at its quota is
/// refused at once, and deleting a snapshot frees its bytes.
#[test]
fn root_snapshots_count_in_the_disk_quota() {
    require_root!();
    let d = daemon(&[]);
    let (key, _) = tenant_key(&d, "q");
    const MIB: u64 = 1 << 20;
    let disk = 32 * MIB;
    let quota = disk + 24 * MIB;
    set_disk_quota(&d, "q", quota);
    let session = |data_bytes: u64| {
        let id = sid(&create(&d, &key, json!({"limits": {"disk": disk}})));
        sh(
            &d,
            &key,
            &id,
            &format!("head -c {data_bytes} /dev/urandom > /workspace/data"),
        );
        id
    };
    let origin = session(8_000_000);
    let (status, first) = take_snapshot(&d, &key, &origin);
    assert_eq!(status, 201, "{first}");
    let first_bytes = first["size_bytes"].as_u64().unwrap();
    assert!(first_bytes >= 8_000_000, "{first}");
    let usage = tenant_usage(&d, "q");
    assert_eq!(usage["snapshot_bytes"], first_bytes, "{usage}");

    // 24 MiB beside the session's disk, 8 MB of them the snapshot's: what would fit
    // without it is refused everywhere the quota is checked.
    let (ct, form) = multipart("big.bin", &vec![0u8; 18 * MIB as usize]);
    let (status, body) = d.raw("POST", "/v1/files", Some(&key), Some(&ct), Some(form));
    assert_eq!(status, 429, "upload: {}", String::from_utf8_lossy(&body));
    for body in [
        json!({"limits": {"disk": 18 * MIB}}),
        json!({"limits": {"disk": 4 * MIB}, "volume": "v", "volume_size": "16M"}),
    ] {
        let (status, out) = d.request("POST", "/v1/sessions", Some(&key), Some(body.clone()));
        assert_eq!(
            (status, error_code(&out)),
            (429, "quota_exceeded"),
            "{body}: {out}"
        );
    }
    assert_eq!(session_count(&d, &key), 1);
    assert!(
        volumes(&d, &key).is_empty(),
        "a refused create made a volume"
    );
    delete_session(&d, &key, &origin);

    // An 18 MB snapshot does not fit beside the first: refused after packing, with
    // nothing left of it, running or paused.
    let store_before = store_contents(&d);
    for paused in [false, true] {
        let id = session(18_000_000);
        let digest = sh(&d, &key, &id, "sha256sum /workspace/data");
        if paused {
            let (status, _) = d.request(
                "POST",
                &format!("/v1/sessions/{id}/pause"),
                Some(&key),
                None,
            );
            assert_eq!(status, 200);
        }
        let (status, body) = take_snapshot(&d, &key, &id);
        assert_eq!(
            (status, error_code(&body)),
            (429, "quota_exceeded"),
            "{body}"
        );
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("of its {quota} bytes of disk with this snapshot")),
            "{message}"
        );
        assert_eq!(
            snapshot_ids(&d, &key),
            [first["snapshot_id"].as_str().unwrap()]
        );
        assert_eq!(
            store_contents(&d),
            store_before,
            "a refused snapshot left files"
        );
        assert_eq!(tenant_usage(&d, "q")["snapshot_bytes"], first_bytes);
        let (_, info) = d.request("GET", &format!("/v1/sessions/{id}"), Some(&key), None);
        let state = if paused { "paused" } else { "running" };
        assert_eq!(info["state"], state, "{info}");
        if paused {
            let (status, _) = d.request(
                "POST",
                &format!("/v1/sessions/{id}/resume"),
                Some(&key),
                None,
            );
            assert_eq!(status, 200);
        }
        assert_eq!(sh(&d, &key, &id, "sha256sum /workspace/data"), digest);
        delete_session(&d, &key, &id);
    }

    // At its quota already, a tenant's snapshot is refused before anything is
    // packed: the session can still be snapshotted once there is room.
    let last = session(18_000_000);
    set_disk_quota(&d, "q", disk + first_bytes);
    let (status, body) = take_snapshot(&d, &key, &last);
    assert_eq!(
        (status, error_code(&body)),
        (429, "quota_exceeded"),
        "{body}"
    );
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("leaves no room for a snapshot"),
        "{message}"
    );
    assert_eq!(store_contents(&d), store_before);

    // Deleting a snapshot frees its bytes, in the quota and on disk: the 18 MB
    // one fits now.
    set_disk_quota(&d, "q", quota);
    delete_snapshot(&d, &key, &first);
    assert_eq!(tenant_usage(&d, "q")["snapshot_bytes"], 0);
    let (images, layers) = store_contents(&d);
    assert!(
        images.is_empty() && layers.is_empty(),
        "left in the store: {images:?} {layers:?}"
    );
    let (status, second) = take_snapshot(&d, &key, &last);
    assert_eq!(status, 201, "{second}");
    assert_eq!(
        tenant_usage(&d, "q")["snapshot_bytes"],
        second["size_bytes"]
    );
    delete_snapshot(&d, &key, &second);
    delete_session(&d, &key, &last);
}

/// A snapshot of a session started from another snapshot holds that one's layer
/// too: the quota counts each layer once, and for as long as any of the tenant's
/// snapshots holds it (deleting the first keeps its layer, and its bytes, until the
/// second goes).
#[test]
fn root_snapshots_of_forks_count_each_layer_once_while_any_holds_it() {
    require_root!();
    let d = daemon(&[]);
    let (key, _) = tenant_key(&d, "chain");
    import_tiny_image(&d, "tiny");
    let (_, operator_layers) = store_contents(&d);
    let put = |id: &str, path: &str, data: Vec<u8>| {
        let (status, body) = d.raw("PUT", &files_url(id, path), Some(&key), None, Some(data));
        assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    };
    let origin = sid(&create(&d, &key, json!({"image": "tiny"})));
    put(&origin, "/etc/first", noise(1, 4_000_000));
    let (status, first) = take_snapshot(&d, &key, &origin);
    assert_eq!(status, 201, "{first}");
    let a = first["size_bytes"].as_u64().unwrap();
    assert!(a >= 4_000_000, "{first}");
    // Its image in the store, named directly: not another tenant's way in (nor the
    // owner's, around its quota), whoever knows the snapshot's id.
    let image = first["snapshot_id"]
        .as_str()
        .unwrap()
        .replacen("snap_", "snap-", 1);
    let (thief, _) = tenant_key(&d, "thief");
    for k in [&thief, &key] {
        let (status, body) = d.request(
            "POST",
            "/v1/sessions",
            Some(k),
            Some(json!({ "image": image })),
        );
        assert_eq!((status, error_code(&body)), (404, "not_found"), "{body}");
    }
    let fork = sid(&create(&d, &key, json!({"snapshot": first["snapshot_id"]})));
    put(&fork, "/etc/second", noise(2, 1_000_000));
    let (status, second) = take_snapshot(&d, &key, &fork);
    assert_eq!(status, 201, "{second}");
    let b = second["size_bytes"].as_u64().unwrap();
    assert!((1_000_000..a).contains(&b), "{second}");
    assert_eq!(tenant_usage(&d, "chain")["snapshot_bytes"], a + b);
    delete_session(&d, &key, &fork);
    delete_session(&d, &key, &origin);
    // The second still has the first's layer: it stays, counted.
    delete_snapshot(&d, &key, &first);
    assert_eq!(tenant_usage(&d, "chain")["snapshot_bytes"], a + b);
    let (_, layers) = store_contents(&d);
    assert_eq!(layers.len(), operator_layers.len() + 2, "{layers:?}");
    let fork = sid(&create(
        &d,
        &key,
        json!({"snapshot": second["snapshot_id"]}),
    ));
    let (status, body) = d.raw(
        "GET",
        &files_url(&fork, "/etc/first"),
        Some(&key),
        None,
        None,
    );
    assert_eq!((status, body.len()), (200, 4_000_000));
    delete_session(&d, &key, &fork);
    delete_snapshot(&d, &key, &second);
    assert_eq!(tenant_usage(&d, "chain")["snapshot_bytes"], 0);
    assert_eq!(store_contents(&d).1, operator_layers);
}

/// Snapshots taken at the same moment cannot both slip under the quota: the check
/// and the record are one step.
#[test]
fn root_concurrent_snapshots_cannot_both_slip_under_the_disk_quota() {
    require_root!();
    let d = daemon(&[]);
    let (key, _) = tenant_key(&d, "race");
    const MIB: u64 = 1 << 20;
    let disk = 16 * MIB;
    // Room for one 6 MB snapshot beside two sessions' disks, not for two.
    set_disk_quota(&d, "race", 2 * disk + 9 * MIB);
    for round in 0..2 {
        let sessions: Vec<String> = (0..2)
            .map(|_| sid(&create(&d, &key, json!({"limits": {"disk": disk}}))))
            .collect();
        for id in &sessions {
            sh(
                &d,
                &key,
                id,
                "head -c 6000000 /dev/urandom > /workspace/data",
            );
        }
        let (_, layers_before) = store_contents(&d);
        let results: Vec<(u16, Value)> = std::thread::scope(|scope| {
            let takes: Vec<_> = sessions
                .iter()
                .map(|id| scope.spawn(|| take_snapshot(&d, &key, id)))
                .collect();
            takes.into_iter().map(|t| t.join().unwrap()).collect()
        });
        let made: Vec<&Value> = results
            .iter()
            .filter(|(status, _)| *status == 201)
            .map(|(_, s)| s)
            .collect();
        assert_eq!(made.len(), 1, "round {round}: {results:?}");
        let (status, refused) = results.iter().find(|(status, _)| *status != 201).unwrap();
        assert_eq!(
            (*status, error_code(refused)),
            (429, "quota_exceeded"),
            "{refused}"
        );
        assert_eq!(snapshot_ids(&d, &key).len(), 1);
        assert_eq!(
            tenant_usage(&d, "race")["snapshot_bytes"],
            made[0]["size_bytes"]
        );
        let (_, layers) = store_contents(&d);
        assert_eq!(layers.len(), layers_before.len() + 1, "{layers:?}");
        delete_snapshot(&d, &key, made[0]);
        for id in &sessions {
            delete_session(&d, &key, id);
        }
    }
}
