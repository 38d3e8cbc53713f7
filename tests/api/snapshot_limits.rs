//! Snapshots being taken at once are capped, per tenant and in all: each copies and
//! packs up to a session's disk with the host's CPU and disk, so one tenant cannot
//! keep the host packing for everyone; the packing is paid for by the session it
//! is of. Black-box, against a real `brig serve`.

use std::time::{Duration, Instant};

use crate::common::daemon::Daemon;
use crate::common::sessions::tenant_key;
use serde_json::{json, Value};

/// A session holding `mib` MiB of incompressible data, which takes a while to copy.
fn loaded_session(d: &Daemon, key: &str, mib: u64) -> String {
    let (status, s) = d.request(
        "POST",
        "/v1/sessions",
        Some(key),
        Some(json!({"limits": {"disk": "1G", "memory": "1G"}})),
    );
    assert_eq!(status, 201, "{s}");
    let id = s["session_id"].as_str().unwrap().to_string();
    let cmd = format!("head -c {mib}M /dev/urandom > /workspace/data");
    let (status, r) = d.request(
        "POST",
        &format!("/v1/sessions/{id}/exec"),
        Some(key),
        Some(json!({"cmd": cmd, "timeout_ms": 60_000})),
    );
    assert_eq!((status, &r["exit_code"]), (200, &json!(0)), "{r}");
    id
}

fn snapshot(d: &Daemon, key: &str, id: &str) -> (u16, Value) {
    d.request(
        "POST",
        &format!("/v1/sessions/{id}/snapshots"),
        Some(key),
        Some(json!({})),
    )
}

/// How many snapshots the daemon is taking now, from its metrics.
fn snapshots_running(d: &Daemon) -> u64 {
    let (status, body) = d.raw("GET", "/metrics", None, None, None);
    assert_eq!(status, 200);
    String::from_utf8_lossy(&body)
        .lines()
        .find_map(|line| line.strip_prefix("brig_snapshots_running "))
        .map_or(0, |n| n.trim().parse::<f64>().unwrap() as u64)
}

/// Takes a snapshot of `busy` (a session of `busy_key`'s) and, once the daemon
/// counts it under way, calls `meanwhile`. Returns what `meanwhile` returned, or
/// `None` if the snapshot was not seen under way from before `meanwhile` started
/// until after it ended. Either way the snapshot is deleted.
fn while_snapshotting<T: Send>(
    d: &Daemon,
    busy_key: &str,
    busy: &str,
    meanwhile: impl FnOnce() -> T + Send,
) -> Option<T> {
    let (result, (status, snap)) = std::thread::scope(|scope| {
        let taking = scope.spawn(|| snapshot(d, busy_key, busy));
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut result = None;
        while !taking.is_finished() && Instant::now() < deadline {
            if snapshots_running(d) > 0 {
                let answered = meanwhile();
                // Conclusive only if the first was still under way once
                // `meanwhile` had its answers.
                if !taking.is_finished() {
                    result = Some(answered);
                }
                break;
            }
        }
        (result, taking.join().unwrap())
    });
    assert_eq!(status, 201, "{snap}");
    let (status, body) = d.request(
        "DELETE",
        &format!("/v1/snapshots/{}", snap["snapshot_id"].as_str().unwrap()),
        Some(busy_key),
        None,
    );
    assert_eq!(status, 204, "{body}");
    result
}

/// Runs `attempt` against sessions holding more and more data until the snapshot
/// it races is seen under way (the premise), at most three times.
fn with_a_snapshot_under_way(d: &Daemon, key: &str, mut attempt: impl FnMut(&str) -> bool) {
    for mib in [160, 320, 480] {
        let busy = loaded_session(d, key, mib);
        let seen = attempt(&busy);
        let (status, _) = d.request("DELETE", &format!("/v1/sessions/{busy}"), Some(key), None);
        assert_eq!(status, 204);
        if seen {
            return;
        }
    }
    panic!("no snapshot was ever seen under way: the caps were not raced");
}

#[test]
fn root_a_tenant_takes_no_more_snapshots_at_once_than_its_cap() {
    require_root!();
    let d = Daemon::start(&["--tenant-max-snapshots", "1", "--max-snapshots", "8"]);
    let key = tenant_key(&d, "greedy");
    let other_key = tenant_key(&d, "other");
    let second = loaded_session(&d, &key, 1);
    let others = loaded_session(&d, &other_key, 1);
    with_a_snapshot_under_way(&d, &key, |busy| {
        let raced = while_snapshotting(&d, &key, busy, || {
            (
                snapshot(&d, &key, &second),
                snapshot(&d, &other_key, &others),
            )
        });
        let Some(((status, refused), (other_status, other_snap))) = raced else {
            return false;
        };
        assert_eq!(status, 429, "{refused}");
        assert_eq!(refused["error"]["code"], "quota_exceeded", "{refused}");
        // Another tenant is not held to this one's cap.
        assert_eq!(other_status, 201, "{other_snap}");
        let id = other_snap["snapshot_id"].as_str().unwrap();
        let (status, _) = d.request(
            "DELETE",
            &format!("/v1/snapshots/{id}"),
            Some(&other_key),
            None,
        );
        assert_eq!(status, 204);
        true
    });
    // Once it is done, the tenant may take one again.
    let (status, snap) = snapshot(&d, &key, &second);
    assert_eq!(status, 201, "{snap}");
    let id = snap["snapshot_id"].as_str().unwrap();
    let (status, _) = d.request("DELETE", &format!("/v1/snapshots/{id}"), Some(&key), None);
    assert_eq!(status, 204);
    for (k, id) in [(&key, &second), (&other_key, &others)] {
        let (status, _) = d.request("DELETE", &format!("/v1/sessions/{id}"), Some(k), None);
        assert_eq!(status, 204);
    }
}

#[test]
fn root_the_daemon_takes_no_more_snapshots_at_once_than_its_cap() {
    require_root!();
    let d = Daemon::start(&["--tenant-max-snapshots", "4", "--max-snapshots", "1"]);
    let key = tenant_key(&d, "first");
    let other_key = tenant_key(&d, "second");
    let others = loaded_session(&d, &other_key, 1);
    with_a_snapshot_under_way(&d, &key, |busy| {
        let Some((status, refused)) =
            while_snapshotting(&d, &key, busy, || snapshot(&d, &other_key, &others))
        else {
            return false;
        };
        assert_eq!(status, 503, "{refused}");
        assert_eq!(refused["error"]["code"], "unavailable", "{refused}");
        true
    });
    let (status, _) = d.request(
        "DELETE",
        &format!("/v1/sessions/{others}"),
        Some(&other_key),
        None,
    );
    assert_eq!(status, 204);
}

fn cpu_seconds(d: &Daemon, key: &str, id: &str) -> f64 {
    let (status, stats) = d.request("GET", &format!("/v1/sessions/{id}/stats"), Some(key), None);
    assert_eq!(status, 200, "{stats}");
    stats["cpu_seconds"].as_f64().expect("cpu accounting")
}

/// Packing a snapshot costs CPU: the session's tenant pays it, in the session's
/// own cgroup, not the daemon (and so every other tenant).
#[test]
fn root_a_snapshots_packing_is_charged_to_its_session() {
    require_root!();
    let d = Daemon::start(&[]);
    let key = tenant_key(&d, "packer");
    let id = loaded_session(&d, &key, 160);
    // Idle, the session uses no CPU: what it gains next is the packing's.
    let before = cpu_seconds(&d, &key, &id);
    let (status, snap) = snapshot(&d, &key, &id);
    assert_eq!(status, 201, "{snap}");
    let after = cpu_seconds(&d, &key, &id);
    // Compressing 160 MiB takes a good part of a CPU-second; an idle session's
    // own use in that time is nothing.
    assert!(
        after - before >= 0.05,
        "the session was charged {:.3} s for packing 160 MiB",
        after - before
    );
    let id_snap = snap["snapshot_id"].as_str().unwrap();
    let (status, _) = d.request(
        "DELETE",
        &format!("/v1/snapshots/{id_snap}"),
        Some(&key),
        None,
    );
    assert_eq!(status, 204);
    let (status, _) = d.request("DELETE", &format!("/v1/sessions/{id}"), Some(&key), None);
    assert_eq!(status, 204);
}
