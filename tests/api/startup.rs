//! What the daemon checks and fixes as it starts.

use crate::common::daemon::Daemon;
use crate::support::daemon;

#[test]
fn root_host_tables_sessions_could_fill_are_named_at_start() {
    require_root!();
    // Without systemd (this machine), kernel.pid_max and fs.file-max keep the
    // kernel's small defaults, which sessions can fill for the whole host: the
    // daemon says so at start, once.
    let d = daemon(&[]);
    let sysctl = |path: &str| -> u64 {
        std::fs::read_to_string(path)
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let log = d.log_text();
    for (name, path, systemd) in [
        ("kernel.pid_max", "/proc/sys/kernel/pid_max", 4_194_304),
        ("fs.file-max", "/proc/sys/fs/file-max", i64::MAX as u64),
    ] {
        let warned = log.matches(&format!("{name} is {}", sysctl(path))).count();
        assert_eq!(warned, usize::from(sysctl(path) < systemd), "{name}: {log}");
    }
}

#[test]
fn root_a_data_dir_open_to_others_is_made_private() {
    use std::os::unix::fs::PermissionsExt;
    require_root!();
    // A data dir made beforehand (`mkdir`, systemd's StateDirectory=) is 0755, and
    // the daemon created brig.db 0644 in it: any local user read every tenant's audit.
    let dir = tempfile::Builder::new()
        .prefix("open-data-")
        .tempdir()
        .unwrap();
    let (data, store) = (dir.path().join("data"), dir.path().join("store"));
    std::fs::create_dir(&data).unwrap();
    for path in [dir.path(), data.as_path()] {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let d = Daemon::start_in(&data, &store, &["--default-image", "host"]);
    let (status, _) = d.request("GET", "/v1/audit", Some(d.admin_key()), None);
    assert_eq!(status, 200);
    let mode = std::fs::metadata(&data).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o700, "{mode:o}");
    assert!(d.log_text().contains("made it 0700"), "{}", d.log_text());
    let nobody = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "cat"])
        .arg(data.join("brig.db"))
        .output()
        .unwrap();
    let error = String::from_utf8_lossy(&nobody.stderr);
    assert!(
        !nobody.status.success() && nobody.stdout.is_empty(),
        "uid 65534 read brig.db"
    );
    assert!(error.contains("Permission denied"), "{error}");
}
