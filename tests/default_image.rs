//! A daemon whose default image is missing builds it at start, in the background:
//! `/health` and the log show the build's steps, `/v1/execute` answers 503 saying
//! how far it is and serves once the image is ready; a failed build is reported
//! (health, log, the 503) and not tried again. Tiny recipes on a small shell image
//! stand in for images/python.toml (which CI does not build: minutes, from the
//! network).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::daemon::Daemon;
use serde_json::{json, Value};

/// Far beyond what a tiny build takes (a few seconds).
const BUILD_LIMIT: Duration = Duration::from_secs(300);

/// A small root that runs `sh` and `sleep` (with their libraries), imported as
/// image `base` into `store`.
fn import_base(store: &Path) {
    let tree = tempfile::tempdir().unwrap();
    let dir = tree.path();
    for top in ["bin", "lib", "lib64"] {
        std::fs::create_dir_all(dir.join("usr").join(top)).unwrap();
        std::os::unix::fs::symlink(format!("usr/{top}"), dir.join(top)).unwrap();
    }
    for empty in ["etc", "tmp", "dev", "proc", "sys", "workspace"] {
        std::fs::create_dir_all(dir.join(empty)).unwrap();
    }
    let mut files = std::collections::BTreeSet::new();
    for tool in ["sh", "sleep", "echo"] {
        let path = ["/usr/bin", "/bin"]
            .iter()
            .map(|d| Path::new(d).join(tool))
            .find(|p| p.exists())
            .unwrap_or_else(|| panic!("{tool} is not installed"));
        let ldd = Command::new("ldd").arg(&path).output().unwrap();
        for word in String::from_utf8_lossy(&ldd.stdout).split_whitespace() {
            if word.starts_with('/') {
                files.insert(PathBuf::from(word));
            }
        }
        files.insert(path);
    }
    for file in files {
        let relative = file.strip_prefix("/").unwrap();
        let relative = if relative.starts_with("usr") {
            relative.to_path_buf()
        } else {
            Path::new("usr").join(relative)
        };
        let target = dir.join(relative);
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        std::fs::copy(&file, &target).unwrap();
    }
    let out = common::brig()
        .env_remove("BRIG_STORE")
        .args(["image", "--store"])
        .arg(store)
        .args(["import", "base"])
        .arg(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "import: {out:?}");
}

/// A daemon on a store with `base` only, told to build `name` from `recipe`.
fn daemon(dir: &Path, name: &str, recipe: &str) -> Daemon {
    let store = dir.join("store");
    import_base(&store);
    let recipe_path = dir.join("recipe.toml");
    std::fs::write(&recipe_path, recipe).unwrap();
    let recipe_path = recipe_path.to_str().unwrap().to_string();
    Daemon::start_in(
        &dir.join("data"),
        &store,
        &[
            "--default-image",
            name,
            "--default-image-recipe",
            &recipe_path,
        ],
    )
}

/// The default image's entry in `/health`, once `done` says it is what is awaited.
fn await_health(d: &Daemon, name: &str, done: impl Fn(&Value) -> bool) -> Value {
    let end = Instant::now() + BUILD_LIMIT;
    loop {
        let (status, health) = d.request("GET", "/health", None, None);
        assert_eq!((status, &health["status"]), (200, &json!("ok")), "{health}");
        let image = health["images"][name].clone();
        if done(&image) {
            return image;
        }
        assert!(Instant::now() < end, "still {image} after {BUILD_LIMIT:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn finish(mut d: Daemon, dir: tempfile::TempDir) {
    d.stop();
    d.clean_store();
    drop(d);
    dir.close().unwrap();
}

#[test]
fn root_a_missing_default_image_is_built_at_start_and_then_serves() {
    require_root!();
    let dir = tempfile::tempdir().unwrap();
    let d = daemon(
        dir.path(),
        "tiny",
        "[base]\nimage = \"base\"\nrun = [\"sleep 3\", \"echo built > /built\"]\n",
    );
    let key = d.admin_key().to_string();
    let image = await_health(&d, "tiny", |i| {
        i["state"] == "building" && i["step"].as_str().is_some_and(|s| s.starts_with("step "))
    });
    assert!(image["elapsed_seconds"].is_u64(), "{image}");
    let (status, body) = d.request(
        "POST",
        "/v1/execute",
        Some(&key),
        Some(json!({"code": "1"})),
    );
    assert_eq!(status, 503, "{body}");
    let detail = body["detail"].as_str().unwrap();
    assert!(
        detail.contains("is being built") && detail.contains("step "),
        "{detail}"
    );
    await_health(&d, "tiny", |i| i["state"] == "ready");
    // The image has no python3: what matters is that the run is no longer refused.
    let (status, body) = d.request(
        "POST",
        "/v1/execute",
        Some(&key),
        Some(json!({"code": "1"})),
    );
    assert_ne!(status, 503, "{body}");
    let log = d.log_text();
    assert!(log.contains("building it in the background"), "{log}");
    assert!(log.contains("build: step 1/2"), "{log}");
    assert!(log.contains("the default image is built"), "{log}");
    finish(d, dir);
}

#[test]
fn root_a_failed_default_image_build_is_reported_and_not_retried() {
    require_root!();
    let dir = tempfile::tempdir().unwrap();
    let d = daemon(
        dir.path(),
        "broken",
        "[base]\nimage = \"base\"\nrun = [\"echo 'E: broken on purpose' >&2; exit 7\"]\n",
    );
    let key = d.admin_key().to_string();
    let image = await_health(&d, "broken", |i| i["state"] == "failed");
    let error = image["error"].as_str().unwrap();
    assert!(
        error.contains("exit status 7") && error.contains("E: broken on purpose"),
        "{image}"
    );
    let (status, body) = d.request(
        "POST",
        "/v1/execute",
        Some(&key),
        Some(json!({"code": "1"})),
    );
    assert_eq!(status, 503, "{body}");
    assert!(
        body["detail"].as_str().unwrap().contains("failed"),
        "{body}"
    );
    // Not tried again: one attempt in the log, and still failed a while later.
    std::thread::sleep(Duration::from_secs(3));
    let log = d.log_text();
    assert!(log.contains("building the default image failed"), "{log}");
    assert_eq!(log.matches("build: step 1/1").count(), 1, "{log}");
    let image = await_health(&d, "broken", |_| true);
    assert_eq!(image["state"], "failed", "{image}");
    finish(d, dir);
}

/// With `--no-build-default-image` (and by default in these tests' helper) nothing
/// is built: the image is reported missing, with how to get it.
#[test]
fn root_no_build_default_image_leaves_it_missing() {
    require_root!();
    let d = Daemon::start(&["--default-image", "python"]);
    let image = await_health(&d, "python", |_| true);
    assert_eq!(image["state"], "missing", "{image}");
    let message = image["message"].as_str().unwrap();
    assert!(message.contains("brig image build python"), "{message}");
    assert!(!d.log_text().contains("building it in the background"));
}
