//! What an archive download costs the daemon while its client stalls: its
//! buffers, not the listing of the directory it archives. Black-box, against a
//! real `brig serve` (tests/common/daemon.rs).

mod common;

use std::time::{Duration, Instant};

use common::daemon::Daemon;
use common::sessions::{create, delete, get_and_stall, q, sh};

/// Names in the archived directory, and the length of each.
const NAMES: usize = 120_000;
const NAME_LEN: usize = 240;
/// Downloads started at once, each stalled after its first bytes.
const STALLED: usize = 8;

/// The daemon's resident memory now.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    let kb: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kb * 1024
}

#[test]
fn stalled_archive_downloads_of_a_huge_directory_hold_only_their_buffers() {
    require_root!();
    let started = Instant::now();
    let d = Daemon::start(&["--default-image", "host"]);
    let key = d.admin_key().to_string();
    let id = create(&d, &key);
    // 120,000 names of 240 bytes: 29 MB of names, which a download that held
    // the listing would keep (and more, one allocation per name) while stalled.
    let pad = "n".repeat(NAME_LEN - 6);
    sh(
        &d,
        &key,
        &id,
        &format!(
            "mkdir /workspace/many && cd /workspace/many && \
             seq -w {NAMES} | sed 's/$/{pad}/' | xargs touch"
        ),
    );
    let archive = format!("/v1/sessions/{id}/archive?path={}", q("/workspace/many"));

    // One download read whole first: the daemon's threads and buffers for it exist
    // before the baseline, and the archive holds every name.
    let response = d.send("GET", &archive, Some(&key), None, ());
    assert_eq!(response.status(), 200);
    let mut entries = 0;
    for entry in tar::Archive::new(response.into_body().into_reader())
        .entries()
        .unwrap()
    {
        let entry = entry.unwrap();
        assert_eq!(entry.path_bytes().len(), NAME_LEN, "{:?}", entry.path());
        entries += 1;
    }
    assert_eq!(entries, NAMES);

    let before = rss(d.pid());
    let stalled: Vec<_> = (0..STALLED)
        .map(|_| {
            let (stream, head) = get_and_stall(&d, &archive, &key, 4096, Duration::from_secs(60));
            assert!(head.starts_with(b"HTTP/1.1 200"), "{:?}", &head[..40]);
            stream
        })
        .collect();
    // Each download has filled what sits between it and its client by now; the
    // highest reading over a second is what they hold.
    let mut grew = 0;
    for _ in 0..10 {
        grew = grew.max(rss(d.pid()).saturating_sub(before));
        std::thread::sleep(Duration::from_millis(100));
    }
    // Each needs its 256 KiB pipe to the client, a walk buffer and its thread's
    // stack: ~4.5 MiB was measured for the eight. Holding the listing took ~29
    // MiB each (231 MiB for the eight).
    assert!(
        grew < 48 << 20,
        "{STALLED} stalled downloads grew the daemon by {} MiB: the listing is held",
        grew >> 20
    );
    eprintln!(
        "{STALLED} stalled downloads grew the daemon by {} KiB",
        grew >> 10
    );
    drop(stalled);

    delete(&d, &key, &id);
    assert!(
        started.elapsed() < Duration::from_secs(300),
        "{:?}",
        started.elapsed()
    );
}
