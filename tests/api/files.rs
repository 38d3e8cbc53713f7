//! Files inside a session: upload, download, directories, archives, and paths
//! that try to reach the host.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common;
use crate::common::daemon::Daemon;
use crate::support::{
    assert_fields, create, daemon, delete_session, files_url, multipart, peak_rss, q, sh, sid,
    tar_end, tar_entry, Noise,
};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// A world-writable host directory with a canary file: if a request through the
/// daemon ever resolved a path on the host instead of inside the sandbox, the
/// sandbox user's host uid could read, change or delete it.
struct Canary {
    _dir: tempfile::TempDir,
    dir: PathBuf,
    file: PathBuf,
}

const CANARY: &str = "host canary: never to be read or changed through the API\n";

impl Canary {
    fn new() -> Canary {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::Builder::new()
            .prefix("brig-canary-")
            .tempdir()
            .unwrap();
        let path = dir.path().to_path_buf();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777)).unwrap();
        let file = path.join("canary.txt");
        std::fs::write(&file, CANARY).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666)).unwrap();
        Canary {
            _dir: dir,
            dir: path,
            file,
        }
    }

    fn assert_intact(&self, after: &str) {
        let entries: Vec<_> = std::fs::read_dir(&self.dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(entries, ["canary.txt"], "host dir changed after {after}");
        assert_eq!(
            std::fs::read_to_string(&self.file).unwrap(),
            CANARY,
            "host canary changed after {after}"
        );
    }
}

#[test]
fn root_files_large_upload_and_download_are_streamed_and_identical() {
    require_root!();
    let d = daemon(&[]);
    let key = d.admin_key().to_string();
    let id = sid(&create(&d, &key, json!({})));
    const SIZE: u64 = 64 << 20;
    let before = peak_rss(d.pid());
    // The hash is taken as the body is produced, on the sending side.
    let (tx, rx) = std::sync::mpsc::channel();
    let response = d.send(
        "PUT",
        &files_url(&id, "/workspace/big/blob.bin"),
        Some(&key),
        Some("application/octet-stream"),
        ureq::SendBody::from_owned_reader(HashingReader {
            inner: Noise {
                state: 0x9e37_79b9_7f4a_7c15,
                left: SIZE,
                hash: Sha256::new(),
            },
            done: tx,
        }),
    );
    let status = response.status().as_u16();
    let written: Value = serde_json::from_reader(response.into_body().into_reader()).unwrap();
    assert_eq!(status, 201, "{written}");
    assert_eq!(written["size_bytes"], SIZE);
    let sent = rx.recv().unwrap();

    let response = d.send(
        "GET",
        &files_url(&id, "/workspace/big/blob.bin"),
        Some(&key),
        None,
        (),
    );
    assert_eq!(response.status(), 200);
    let mut reader = response.into_body().into_reader();
    let mut hash = Sha256::new();
    let mut total = 0u64;
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = reader.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        total += n as u64;
        hash.update(&buf[..n]);
    }
    assert_eq!(total, SIZE);
    assert_eq!(hash.finalize().to_vec(), sent, "downloaded bytes differ");
    // The sandbox sees the same bytes.
    let inside = sh(
        &d,
        &key,
        &id,
        "sha256sum /workspace/big/blob.bin | cut -d' ' -f1",
    );
    let hex: String = sent.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(inside.trim(), hex);
    let grew = peak_rss(d.pid()).saturating_sub(before);
    assert!(
        grew < 32 << 20,
        "the daemon's peak memory grew by {grew} bytes: not streamed"
    );
    delete_session(&d, &key, &id);
}

/// Passes bytes through and sends their SHA-256 when done.
struct HashingReader {
    inner: Noise,
    done: std::sync::mpsc::Sender<Vec<u8>>,
}

impl Read for HashingReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n == 0 && !buf.is_empty() {
            let hash = std::mem::take(&mut self.inner.hash).finalize().to_vec();
            let _ = self.done.send(hash);
        }
        Ok(n)
    }
}

#[test]
fn root_files_dir_mkdir_delete_and_archive_round_trip() {
    require_root!();
    let d = daemon(&[]);
    let key = d.admin_key().to_string();
    let id = sid(&create(&d, &key, json!({})));

    let (status, body) = d.request(
        "POST",
        &format!("/v1/sessions/{id}/dir?path=/workspace/a/b/c"),
        Some(&key),
        None,
    );
    assert_eq!(status, 201, "{body}");
    for (path, data) in [
        ("/workspace/a/one.txt", &b"one\n"[..]),
        ("/workspace/a/b/two.txt", b"two two\n"),
        ("/workspace/a/b/c/three.bin", &[0u8, 1, 2, 255][..]),
    ] {
        let (status, bytes) = d.raw(
            "PUT",
            &files_url(&id, path),
            Some(&key),
            Some("application/octet-stream"),
            Some(data.to_vec()),
        );
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(status, 201, "{v}");
        assert_eq!(v["size_bytes"], data.len());
        let (status, back) = d.raw("GET", &files_url(&id, path), Some(&key), None, None);
        assert_eq!((status, back.as_slice()), (200, data));
    }
    let (status, listing) = d.request(
        "GET",
        &format!("/v1/sessions/{id}/dir?path=/workspace/a"),
        Some(&key),
        None,
    );
    assert_eq!(status, 200, "{listing}");
    let mut entries: Vec<(String, String, u64)> = listing["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap().into(),
                e["kind"].as_str().unwrap().into(),
                e["size_bytes"].as_u64().unwrap(),
            )
        })
        .collect();
    entries.sort();
    assert_eq!(entries[0].0, "b");
    assert_eq!(entries[0].1, "directory");
    assert_eq!(entries[1], ("one.txt".into(), "file".into(), 4));
    assert_fields(&listing, &["path", "entries"]);
    assert_fields(
        &listing["entries"][0],
        &["name", "kind", "size_bytes", "mode", "modified_at"],
    );
    assert!(listing["entries"][0]["modified_at"].is_string());

    // Archive out, extract back elsewhere, compare.
    let (status, tarball) = d.raw(
        "GET",
        &format!("/v1/sessions/{id}/archive?path=/workspace/a"),
        Some(&key),
        None,
        None,
    );
    assert_eq!(status, 200);
    let mut names: Vec<String> = tar::Archive::new(tarball.as_slice())
        .entries()
        .unwrap()
        .map(|e| {
            e.unwrap()
                .path()
                .unwrap()
                .to_string_lossy()
                .trim_end_matches('/')
                .to_string()
        })
        .collect();
    names.sort();
    for wanted in ["b/c/three.bin", "b/two.txt", "one.txt"] {
        assert!(
            names.iter().any(|n| n.trim_start_matches("./") == wanted),
            "{wanted} not in {names:?}"
        );
    }
    let (status, bytes) = d.raw(
        "PUT",
        &format!("/v1/sessions/{id}/archive?path=/workspace/copy"),
        Some(&key),
        Some("application/x-tar"),
        Some(tarball),
    );
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(status, 201, "{v}");
    assert!(v["entries"].as_u64().unwrap() >= 3, "{v}");
    assert_eq!(
        sh(
            &d,
            &key,
            &id,
            "cd /workspace/a && find . -type f | sort | xargs sha256sum"
        ),
        sh(
            &d,
            &key,
            &id,
            "cd /workspace/copy && find . -type f | sort | xargs sha256sum"
        )
    );

    // Delete: a file; a non-empty directory only with recursive=true.
    let (status, _) = d.raw(
        "DELETE",
        &files_url(&id, "/workspace/a/one.txt"),
        Some(&key),
        None,
        None,
    );
    assert_eq!(status, 204);
    let (status, body) = d.request(
        "GET",
        &files_url(&id, "/workspace/a/one.txt"),
        Some(&key),
        None,
    );
    assert_eq!(status, 404, "{body}");
    let (status, body) = d.request("DELETE", &files_url(&id, "/workspace/a"), Some(&key), None);
    assert_eq!(status, 409, "non-recursive delete of a full dir: {body}");
    let (status, _) = d.raw(
        "DELETE",
        &format!("{}&recursive=true", files_url(&id, "/workspace/a")),
        Some(&key),
        None,
        None,
    );
    assert_eq!(status, 204);
    assert_eq!(sh(&d, &key, &id, "ls /workspace"), "copy\n");
    let (status, body) = d.request(
        "GET",
        &format!("/v1/sessions/{id}/dir?path=/workspace/nope"),
        Some(&key),
        None,
    );
    assert_eq!(status, 404, "{body}");
    delete_session(&d, &key, &id);
}

#[test]
fn root_files_written_through_the_api_belong_to_the_session_user() {
    require_root!();
    let d = daemon(&[]);
    let key = d.admin_key().to_string();
    let id = sid(&create(&d, &key, json!({})));
    let (status, _) = d.raw(
        "PUT",
        &files_url(&id, "/workspace/new/dir/f.txt"),
        Some(&key),
        None,
        Some(b"x".to_vec()),
    );
    assert_eq!(status, 201);
    let (status, _) = d.raw(
        "POST",
        &format!("/v1/sessions/{id}/dir?path=/tmp/made"),
        Some(&key),
        None,
        None,
    );
    assert_eq!(status, 201);
    let mut tarball = Vec::new();
    tar_entry(&mut tarball, "t/", tar::EntryType::Directory, "", b"");
    tar_entry(&mut tarball, "t/f", tar::EntryType::Regular, "", b"data");
    tar_end(&mut tarball);
    let (status, body) = d.raw(
        "PUT",
        &format!("/v1/sessions/{id}/archive?path=/workspace/arch"),
        Some(&key),
        None,
        Some(tarball),
    );
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    let owners = sh(
        &d,
        &key,
        &id,
        "stat -c %u:%g /workspace/new /workspace/new/dir /workspace/new/dir/f.txt /tmp/made /workspace/arch /workspace/arch/t /workspace/arch/t/f",
    );
    assert_eq!(owners, "1000:1000\n".repeat(7));
    // And the sandbox may change them.
    sh(
        &d,
        &key,
        &id,
        "echo more >> /workspace/new/dir/f.txt && rm -r /workspace/arch",
    );
    delete_session(&d, &key, &id);
}

#[test]
fn root_files_symlinks_planted_in_the_sandbox_never_reach_the_host() {
    require_root!();
    let canary = Canary::new();
    let d = daemon(&[]);
    let key = d.admin_key().to_string();
    let id = sid(&create(&d, &key, json!({})));
    let host_file = canary.file.to_str().unwrap().to_string();
    let host_dir = canary.dir.to_str().unwrap().to_string();
    sh(
        &d,
        &key,
        &id,
        &format!("ln -s {host_file} /workspace/evil && ln -s / /workspace/root && ln -s {host_dir} /workspace/evildir"),
    );
    let through_root = format!("/workspace/root{host_file}");
    let through_dir = "/workspace/evildir/canary.txt".to_string();
    for path in [
        "/workspace/evil",
        through_root.as_str(),
        through_dir.as_str(),
        host_file.as_str(),
    ] {
        let (status, body) = d.raw("GET", &files_url(&id, path), Some(&key), None, None);
        assert!(
            !String::from_utf8_lossy(&body).contains("host canary"),
            "GET {path} read the host canary ({status})"
        );
    }
    for path in ["/workspace/evildir", "/workspace/root/tmp"] {
        let (_, listing) = d.request(
            "GET",
            &format!("/v1/sessions/{id}/dir?path={}", q(path)),
            Some(&key),
            None,
        );
        let text = listing.to_string();
        assert!(
            !text.contains("canary.txt") && !text.contains("brig-canary-"),
            "dir {path} listed the host: {text}"
        );
    }
    let (_, tarball) = d.raw(
        "GET",
        &format!("/v1/sessions/{id}/archive?path=/workspace"),
        Some(&key),
        None,
        None,
    );
    assert!(
        !String::from_utf8_lossy(&tarball).contains("host canary"),
        "the archive holds the host canary"
    );

    for path in [
        "/workspace/evil",
        through_root.as_str(),
        through_dir.as_str(),
        host_file.as_str(),
    ] {
        d.raw(
            "PUT",
            &files_url(&id, path),
            Some(&key),
            None,
            Some(b"PWNED\n".to_vec()),
        );
        canary.assert_intact(&format!("PUT {path}"));
        let mut tarball = Vec::new();
        tar_entry(
            &mut tarball,
            "canary.txt",
            tar::EntryType::Regular,
            "",
            b"PWNED\n",
        );
        tar_entry(
            &mut tarball,
            "new.txt",
            tar::EntryType::Regular,
            "",
            b"PWNED\n",
        );
        tar_end(&mut tarball);
        let parent = Path::new(path)
            .parent()
            .unwrap()
            .to_str()
            .unwrap()
            .to_string();
        d.raw(
            "PUT",
            &format!("/v1/sessions/{id}/archive?path={}", q(&parent)),
            Some(&key),
            None,
            Some(tarball),
        );
        canary.assert_intact(&format!("PUT archive into {parent}"));
        d.raw(
            "POST",
            &format!(
                "/v1/sessions/{id}/dir?path={}",
                q(&format!("{parent}/newdir"))
            ),
            Some(&key),
            None,
            None,
        );
        canary.assert_intact(&format!("mkdir in {parent}"));
    }
    for path in [
        through_dir.as_str(),
        through_root.as_str(),
        host_file.as_str(),
        "/workspace/evil",
    ] {
        d.raw("DELETE", &files_url(&id, path), Some(&key), None, None);
        canary.assert_intact(&format!("DELETE {path}"));
    }
    for path in [
        "/workspace/evildir",
        "/workspace/root/tmp",
        "/workspace/root",
    ] {
        d.raw(
            "DELETE",
            &format!("{}&recursive=true", files_url(&id, path)),
            Some(&key),
            None,
            None,
        );
        canary.assert_intact(&format!("DELETE {path} recursive"));
    }
    // The host's /tmp survived the recursive delete through `/workspace/root`.
    assert!(Path::new("/tmp").is_dir());
    delete_session(&d, &key, &id);
    canary.assert_intact("the session's end");
}

#[test]
fn root_files_dot_dot_and_magic_links_stay_inside_or_are_refused() {
    require_root!();
    let d = daemon(&[]);
    let key = d.admin_key().to_string();
    let id = sid(&create(&d, &key, json!({})));
    let host_shadow = std::fs::read("/etc/shadow").unwrap_or_default();
    let host_hostname = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
    for path in [
        "/workspace/../../../../etc/shadow",
        "/../../etc/shadow",
        "/etc/shadow",
        "/workspace/../../../../etc/hostname",
    ] {
        let (status, body) = d.raw("GET", &files_url(&id, path), Some(&key), None, None);
        if path.ends_with("shadow") {
            assert!(
                status != 200 || (body != host_shadow && !host_shadow.is_empty()),
                "GET {path} returned the host's /etc/shadow"
            );
        } else if status == 200
            && !host_hostname.trim().is_empty()
            && host_hostname.trim() != "sandbox"
        {
            assert_ne!(
                String::from_utf8_lossy(&body).trim(),
                host_hostname.trim(),
                "GET {path} read the host's file"
            );
        }
    }
    // `..` resolves inside the sandbox's root: writes land in the sandbox.
    let (status, _) = d.raw(
        "PUT",
        &files_url(&id, "/workspace/../../../tmp/dots.txt"),
        Some(&key),
        None,
        Some(b"in".to_vec()),
    );
    assert_eq!(status, 201);
    assert_eq!(sh(&d, &key, &id, "cat /tmp/dots.txt"), "in");

    for path in [
        "/proc/1/root/etc/passwd",
        "/proc/self/root/etc/passwd",
        "/proc/1/cwd/x",
        "/proc/1/fd/0",
        "/proc/self/fd/0",
        "/proc/thread-self/root/etc/passwd",
    ] {
        let (status, body) = d.raw("GET", &files_url(&id, path), Some(&key), None, None);
        assert!(
            (400..500).contains(&status),
            "GET {path}: {status} {}",
            String::from_utf8_lossy(&body)
        );
        let (status, _) = d.raw(
            "PUT",
            &files_url(&id, path),
            Some(&key),
            None,
            Some(b"x".to_vec()),
        );
        assert!((400..500).contains(&status), "PUT {path}: {status}");
        let (status, _) = d.raw("DELETE", &files_url(&id, path), Some(&key), None, None);
        assert!((400..500).contains(&status), "DELETE {path}: {status}");
    }
    // Relative and empty paths are bad paths.
    for path in ["workspace/x", ""] {
        let (status, body) = d.request("GET", &files_url(&id, path), Some(&key), None);
        assert_eq!(status, 422, "GET {path:?}: {body}");
    }
    delete_session(&d, &key, &id);
}

/// An archive that cannot be finished (here a directory nested deeper than the walk
/// goes, below a file already sent) must not reach the client as a complete
/// download: the response is cut off, so the client sees an error, never a short
/// tar that looks whole.
#[test]
fn root_an_archive_that_fails_midway_ends_in_an_error_not_a_short_tar() {
    require_root!();
    let d = daemon(&[]);
    let key = d.admin_key().to_string();
    let id = sid(&create(&d, &key, json!({})));
    sh(
        &d,
        &key,
        &id,
        "mkdir -p /workspace/a && head -c 300000 /dev/urandom > /workspace/a/0-first && \
         cd /workspace/a && for i in $(seq 300); do mkdir z && cd z || exit 1; done",
    );
    let response = d.send(
        "GET",
        &format!("/v1/sessions/{id}/archive?path=/workspace/a"),
        Some(&key),
        None,
        (),
    );
    assert_eq!(
        response.status().as_u16(),
        200,
        "the archive starts streaming"
    );
    let mut bytes = Vec::new();
    let read = response.into_body().into_reader().read_to_end(&mut bytes);
    assert!(
        read.is_err(),
        "the cut archive read as complete ({} bytes)",
        bytes.len()
    );
    // The audit log says it started, then that it was not finished, and why.
    let events = |outcome: &str| -> Vec<Value> {
        let (_, list) = d.request(
            "GET",
            &format!("/v1/audit?session_id={id}&action=file.archive.read&outcome={outcome}"),
            Some(&key),
            None,
        );
        list["events"].as_array().unwrap().clone()
    };
    assert!(
        common::eventually(5000, || events("error").len() == 1),
        "{:?}",
        events("error")
    );
    let cut = &events("error")[0];
    assert_eq!(cut["detail"]["path"], "/workspace/a", "{cut}");
    assert_eq!(cut["detail"]["finished"], false, "{cut}");
    assert!(cut["detail"]["error"].as_str().unwrap().len() > 5, "{cut}");
    assert_eq!(events("ok").len(), 1);
    // A directory the walk can finish still downloads whole.
    sh(&d, &key, &id, "rm -rf /workspace/a/z");
    let (status, tar) = d.raw(
        "GET",
        &format!("/v1/sessions/{id}/archive?path=/workspace/a"),
        Some(&key),
        None,
        None,
    );
    assert_eq!(status, 200);
    let mut archive = tar::Archive::new(&tar[..]);
    let names: Vec<String> = archive
        .entries()
        .unwrap()
        .map(|e| e.unwrap().path().unwrap().display().to_string())
        .collect();
    assert_eq!(names, vec!["0-first".to_string()]);
    assert_eq!(events("ok").len(), 2);
    assert_eq!(events("error").len(), 1, "a whole download is no error");
    // A client that hangs up midway leaves the same trace.
    sh(
        &d,
        &key,
        &id,
        "head -c 30000000 /dev/zero > /workspace/a/big",
    );
    let response = d.send(
        "GET",
        &format!("/v1/sessions/{id}/archive?path=/workspace/a"),
        Some(&key),
        None,
        (),
    );
    let mut first = [0u8; 1024];
    response
        .into_body()
        .into_reader()
        .read_exact(&mut first)
        .unwrap();
    assert!(
        common::eventually(10_000, || events("error").len() == 2),
        "{:?}",
        events("error")
    );
}

#[test]
fn root_archive_upload_with_escaping_entries_is_refused_or_contained() {
    require_root!();
    let canary = Canary::new();
    let d = daemon(&[]);
    let key = d.admin_key().to_string();
    let id = sid(&create(&d, &key, json!({})));
    sh(&d, &key, &id, "mkdir -p /workspace/dest");
    let host_dir = canary.dir.to_str().unwrap().to_string();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("../ entry", {
            let mut t = Vec::new();
            tar_entry(&mut t, "../escaped.txt", tar::EntryType::Regular, "", b"x");
            tar_end(&mut t);
            t
        }),
        ("deep ../ entry", {
            let mut t = Vec::new();
            tar_entry(
                &mut t,
                "a/../../../escaped.txt",
                tar::EntryType::Regular,
                "",
                b"x",
            );
            tar_end(&mut t);
            t
        }),
        ("absolute entry", {
            let mut t = Vec::new();
            tar_entry(
                &mut t,
                "/workspace/escaped.txt",
                tar::EntryType::Regular,
                "",
                b"x",
            );
            tar_end(&mut t);
            t
        }),
        ("symlink to .. then a file through it", {
            let mut t = Vec::new();
            tar_entry(&mut t, "up", tar::EntryType::Symlink, "..", b"");
            tar_entry(&mut t, "up/escaped.txt", tar::EntryType::Regular, "", b"x");
            tar_end(&mut t);
            t
        }),
        ("symlink to the host dir then a file through it", {
            let mut t = Vec::new();
            tar_entry(&mut t, "host", tar::EntryType::Symlink, &host_dir, b"");
            tar_entry(
                &mut t,
                "host/canary.txt",
                tar::EntryType::Regular,
                "",
                b"PWNED",
            );
            tar_entry(
                &mut t,
                "host/new.txt",
                tar::EntryType::Regular,
                "",
                b"PWNED",
            );
            tar_end(&mut t);
            t
        }),
        ("hard link to a file outside", {
            let mut t = Vec::new();
            tar_entry(&mut t, "hl", tar::EntryType::Link, "../outside.txt", b"");
            tar_end(&mut t);
            t
        }),
    ];
    sh(&d, &key, &id, "echo outside > /workspace/outside.txt");
    for (what, tarball) in cases {
        let (status, body) = d.raw(
            "PUT",
            &format!("/v1/sessions/{id}/archive?path=/workspace/dest"),
            Some(&key),
            Some("application/x-tar"),
            Some(tarball),
        );
        eprintln!("{what}: {status} {}", String::from_utf8_lossy(&body));
        assert!(
            status == 201 || (400..500).contains(&status),
            "{what}: {status}"
        );
        canary.assert_intact(what);
        let outside = sh(&d, &key, &id, "ls /workspace; ls / | grep escaped || true");
        assert_eq!(
            outside, "dest\noutside.txt\n",
            "{what} wrote outside /workspace/dest"
        );
        assert_eq!(sh(&d, &key, &id, "cat /workspace/outside.txt"), "outside\n");
        sh(
            &d,
            &key,
            &id,
            "rm -rf /workspace/dest && mkdir /workspace/dest",
        );
    }
    delete_session(&d, &key, &id);
}

/// A request that must be answered within `secs` (a daemon thread blocked on a FIFO
/// or streaming an endless device would not be).
fn raw_within(d: &Daemon, secs: u64, method: &str, path: &str, key: &str) -> (u16, Vec<u8>) {
    let (tx, rx) = std::sync::mpsc::channel();
    let (url, key, verb) = (d.url(path), key.to_string(), method.to_string());
    std::thread::spawn(move || {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(secs + 5)))
            .build()
            .into();
        let request = ureq::http::Request::builder()
            .method(verb.as_str())
            .uri(url)
            .header("Authorization", format!("Bearer {key}"))
            .body(())
            .unwrap();
        let result = agent.run(request).map(|r| {
            let status = r.status().as_u16();
            let mut body = Vec::new();
            let _ = r
                .into_body()
                .into_reader()
                .take(64 << 20)
                .read_to_end(&mut body);
            (status, body)
        });
        let _ = tx.send(result);
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(Ok(answer)) => answer,
        Ok(Err(e)) => panic!("{method} {path}: {e}"),
        Err(_) => panic!("{method} {path}: no answer within {secs} s"),
    }
}

#[test]
fn root_files_fifos_and_devices_are_not_read_as_files() {
    require_root!();
    let d = daemon(&[]);
    let key = d.admin_key().to_string();
    let id = sid(&create(&d, &key, json!({})));
    sh(
        &d,
        &key,
        &id,
        "mkfifo /workspace/fifo && mkdir -p /workspace/d && mkfifo /workspace/d/fifo2",
    );
    for path in [
        "/workspace/fifo",
        "/dev/zero",
        "/dev/urandom",
        "/dev/null",
        "/workspace",
    ] {
        let (status, body) = raw_within(&d, 10, "GET", &files_url(&id, path), &key);
        assert!(
            (400..500).contains(&status),
            "GET {path}: {status} with {} bytes",
            body.len()
        );
    }
    // Archives hold special files as entries, never their contents.
    for dir in ["/workspace", "/dev"] {
        let (status, body) = raw_within(
            &d,
            10,
            "GET",
            &format!("/v1/sessions/{id}/archive?path={dir}"),
            &key,
        );
        assert_eq!(status, 200, "archive of {dir}");
        assert!(
            body.len() < 1 << 20,
            "archive of {dir}: {} bytes",
            body.len()
        );
    }
    // A background process whose output file the sandbox swapped for a FIFO.
    let (status, p) = d.request(
        "POST",
        &format!("/v1/sessions/{id}/processes"),
        Some(&key),
        Some(json!({"cmd": "echo hi; sleep 30"})),
    );
    assert_eq!(status, 201, "{p}");
    let pid = p["process_id"].as_u64().unwrap();
    sh(
        &d,
        &key,
        &id,
        "cd /tmp/.brig/jobs && for f in *.out *.err; do rm $f && mkfifo $f; done",
    );
    let base = format!("/v1/sessions/{id}/processes/{pid}");
    let (status, body) = raw_within(&d, 10, "GET", &format!("{base}/output"), &key);
    assert!(
        status == 200 || (400..500).contains(&status),
        "output: {status} {}",
        String::from_utf8_lossy(&body)
    );
    let (status, _) = d.request(
        "POST",
        &format!("{base}/signal"),
        Some(&key),
        Some(json!({"signal": 9})),
    );
    assert_eq!(status, 204);
    let (status, _) = raw_within(
        &d,
        10,
        "POST",
        &format!("{base}/wait?timeout_ms=5000"),
        &key,
    );
    assert_eq!(status, 200);
    let (status, _) = raw_within(&d, 10, "GET", &format!("{base}/stream"), &key);
    assert_eq!(status, 200);
    delete_session(&d, &key, &id);
}

#[test]
fn root_uploads_over_their_limits_leave_nothing() {
    require_root!();
    let d = daemon(&["--max-file-size", "1M"]);
    let key = d.admin_key().to_string();
    let id = sid(&create(&d, &key, json!({"limits": {"disk": "4M"}})));
    let two_mib = vec![7u8; 2 << 20];

    let (status, body) = d.request("PUT", &files_url(&id, "/workspace/big"), Some(&key), None);
    assert_eq!(status, 201, "an empty upload is fine: {body}");
    // Refused with 413, or (the server stops reading at the limit) with the
    // connection closed while the client still sends.
    let refused =
        |method: &str, path: &str, ct: Option<&str>, body: ureq::SendBody<'static>| match d
            .try_send(method, path, Some(&key), ct, body)
        {
            Ok(response) => assert_eq!(response.status(), 413, "{method} {path}"),
            Err(ureq::Error::Io(e)) => eprintln!("{method} {path}: closed while sending: {e}"),
            Err(e) => panic!("{method} {path}: {e}"),
        };
    let streamed = || ureq::SendBody::from_owned_reader(std::io::Cursor::new(two_mib.clone()));
    refused("PUT", &files_url(&id, "/workspace/big"), None, streamed());
    refused("PUT", &files_url(&id, "/workspace/big2"), None, streamed());
    let (ct, form) = multipart("big.bin", &two_mib);
    refused(
        "POST",
        "/v1/files",
        Some(&ct),
        ureq::SendBody::from_owned_reader(std::io::Cursor::new(form)),
    );
    let (_, files) = d.request("GET", "/v1/files", Some(&key), None);
    assert_eq!(files["files"], json!([]));
    let mut tarball = Vec::new();
    tar_entry(&mut tarball, "big", tar::EntryType::Regular, "", &two_mib);
    tar_end(&mut tarball);
    refused(
        "PUT",
        &format!("/v1/sessions/{id}/archive?path=/workspace/t"),
        None,
        ureq::SendBody::from_owned_reader(std::io::Cursor::new(tarball)),
    );

    // The session's disk (4 MiB): the upload that does not fit is refused whole.
    let chunk = vec![1u8; 900 << 10];
    let mut stored = 0;
    let refused = loop {
        let (status, body) = d.raw(
            "PUT",
            &files_url(&id, &format!("/workspace/f{stored}")),
            Some(&key),
            None,
            Some(chunk.clone()),
        );
        if status != 201 {
            break (
                status,
                String::from_utf8_lossy(&body).into_owned(),
                format!("/workspace/f{stored}"),
            );
        }
        stored += 1;
        assert!(stored < 10, "a 4M disk took {stored} files of 900K");
    };
    assert_eq!(refused.0, 507, "{}", refused.1);
    assert!(refused.1.contains("no_space"), "{}", refused.1);
    // The empty file at /workspace/big stays as it was; nothing else was made.
    let listing = sh(
        &d,
        &key,
        &id,
        "stat -c %n:%s /workspace/*; ls -A /workspace/t 2>/dev/null | wc -l",
    );
    assert!(listing.starts_with("/workspace/big:0\n"), "{listing}");
    assert!(
        !listing.contains("big2") && listing.ends_with("\n0\n"),
        "{listing}"
    );
    assert!(
        !listing.contains(&format!("{}:", refused.2)),
        "the refused upload left {}: {listing}",
        refused.2
    );
    // The sandbox itself can use what is left (nothing half-written holds it).
    sh(
        &d,
        &key,
        &id,
        "rm /workspace/f0 && head -c 800000 /dev/zero > /workspace/again",
    );
    delete_session(&d, &key, &id);
}
