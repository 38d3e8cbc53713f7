//! brig run by an unprivileged user: it works with what it can do, and `enforced`
//! says what was skipped. The test creates (and removes) its own user.

mod common;

use std::process::Command;

use common::*;

/// A system user that exists for the lifetime of this value.
struct TestUser {
    name: String,
    uid: u32,
    gid: u32,
}

impl TestUser {
    fn create() -> Option<TestUser> {
        let name = format!("brigt{}", std::process::id());
        let ok = Command::new("useradd")
            .args([
                "--system",
                "--no-create-home",
                "--user-group",
                "--shell",
                "/usr/sbin/nologin",
                &name,
            ])
            .status()
            .ok()?
            .success();
        if !ok {
            return None;
        }
        let id = |flag: &str| -> Option<u32> {
            let out = Command::new("id").args([flag, &name]).output().ok()?;
            String::from_utf8_lossy(&out.stdout).trim().parse().ok()
        };
        let user = TestUser {
            uid: id("-u")?,
            gid: id("-g")?,
            name,
        };
        Some(user)
    }

    fn brig(&self, args: &[&str]) -> std::process::Output {
        Command::new("setpriv")
            .args([
                &format!("--reuid={}", self.uid),
                &format!("--regid={}", self.gid),
                "--clear-groups",
                "--",
            ])
            .arg(brig_path())
            .args(args)
            .current_dir("/")
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .output()
            .unwrap()
    }
}

impl Drop for TestUser {
    fn drop(&mut self) {
        let _ = Command::new("userdel").arg(&self.name).status();
    }
}

#[test]
fn root_rootless_brig_isolates_and_reports_what_it_skipped() {
    require_root!();
    let max: u64 = std::fs::read_to_string("/proc/sys/user/max_user_namespaces")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    if max == 0 {
        eprintln!("skipped: unprivileged user namespaces are disabled on this host");
        return;
    }
    let user = TestUser::create().expect("useradd");
    let out = user.brig(&[
        "run",
        "--json",
        "--",
        "sh",
        "-c",
        "id -u; cat /proc/self/uid_map; grep CapEff /proc/self/status; ls /proc | grep -c '^[0-9]'; touch /usr/x 2>/dev/null || echo ro; awk '/Max processes/{print $3}' /proc/self/limits",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("{e}: {stdout} / {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(v["exit_code"], 0, "{v}");
    let lines: Vec<String> = v["stdout"]
        .as_str()
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    assert_eq!(lines[0], "1000");
    // Only the caller's own uid is mapped.
    let map: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(map, vec!["1000", &user.uid.to_string(), "1"]);
    assert_eq!(lines[2], "CapEff:\t0000000000000000");
    assert!(lines[3].parse::<u32>().unwrap() <= 4);
    assert_eq!(lines[4], "ro");
    // Without a cgroup, RLIMIT_NPROC stands in for the pids limit.
    assert_eq!(lines[5], "256");

    let e = &v["enforced"];
    assert_eq!(e["identity"]["rootless"], true);
    assert_eq!(e["identity"]["host_uid"], user.uid);
    assert_eq!(e["cgroup"]["applied"], false);
    assert!(
        e["cgroup"]["reason"]
            .as_str()
            .is_some_and(|r| !r.is_empty()),
        "{e}"
    );
    assert_eq!(e["rlimits"]["nproc"], 256);
    assert_eq!(e["capabilities"]["all_dropped"], true);
    assert_eq!(e["seccomp"]["enabled"], true);
    assert_eq!(e["landlock"]["status"], "fully_enforced");
    assert_eq!(e["namespaces"].as_array().unwrap().len(), 7, "{e}");

    // Exit statuses work the same way.
    let out = user.brig(&["run", "--", "sh", "-c", "exit 9"]);
    assert_eq!(out.status.code(), Some(9));
}
