//! Layered roots built from plain host directories (`--layer`): many layers, and
//! what the sandbox's writes and the image's ownership look like.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;

/// A minimal root that can run `/bin/sh` scripts: dash, a few tools, their libraries.
fn shell_root(dir: &Path) {
    std::fs::create_dir_all(dir.join("bin")).unwrap();
    let mut libs = std::collections::BTreeSet::new();
    for (tool, name) in [
        ("/bin/dash", "sh"),
        ("/bin/cat", "cat"),
        ("/bin/ls", "ls"),
        ("/usr/bin/stat", "stat"),
        ("/bin/mkdir", "mkdir"),
        ("/bin/rm", "rm"),
    ] {
        std::fs::copy(tool, dir.join("bin").join(name)).unwrap();
        let ldd = Command::new("ldd").arg(tool).output().unwrap();
        for word in String::from_utf8_lossy(&ldd.stdout).split_whitespace() {
            if word.starts_with('/') {
                libs.insert(word.to_string());
            }
        }
    }
    for lib in libs {
        let target = dir.join(lib.trim_start_matches('/'));
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        std::fs::copy(&lib, &target).unwrap();
    }
}

fn layer_args(layers: &[std::path::PathBuf]) -> Vec<String> {
    layers
        .iter()
        .flat_map(|l| ["--layer".to_string(), l.display().to_string()])
        .collect()
}

/// More layers than the one-page mount(2) option string could name: overlayfs gets
/// them one `lowerdir+` at a time, upper layers win, all are visible.
#[test]
fn root_three_hundred_layers_stack_in_order() {
    require_root!();
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base");
    shell_root(&base);
    let mut layers = vec![base];
    for i in 1..=300 {
        let layer = dir.path().join(format!("layer-with-a-long-name-{i:04}"));
        std::fs::create_dir_all(layer.join("data")).unwrap();
        std::fs::write(layer.join("data").join(format!("f{i}")), format!("{i}")).unwrap();
        // Every layer writes the same file: the topmost must win.
        std::fs::write(layer.join("data/top"), format!("{i}")).unwrap();
        layers.push(layer);
    }
    let total: usize = layers.iter().map(|l| l.as_os_str().len() + 1).sum();
    assert!(
        total > 4096,
        "the layers must not fit in one page ({total})"
    );
    let args = layer_args(&layers);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run(
        &args,
        &["/bin/sh", "-c", "ls /data | (n=0; while read x; do n=$((n+1)); done; echo $n); cat /data/top; echo; cat /data/f1 /data/f150"],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(stdout.trim(), "301\n300\n1150", "{stdout}");
}

/// Files of a layer owned by host root belong to the sandbox user inside (the
/// layer mounts are idmapped), so it can change its own root; the changes stay in
/// the sandbox: the layer directory on the host is untouched.
#[test]
fn root_layer_files_belong_to_the_sandbox_user_and_writes_stay_inside() {
    require_root!();
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base");
    shell_root(&base);
    std::fs::create_dir_all(base.join("etc")).unwrap();
    std::fs::write(base.join("etc/config"), "original\n").unwrap();
    let args = layer_args(std::slice::from_ref(&base));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run(
        &args,
        &[
            "/bin/sh",
            "-c",
            "stat -c '%u %U' /etc/config && echo changed > /etc/config && cat /etc/config \
             && rm /bin/ls && mkdir /opt && echo ok",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(
        stdout.starts_with("1000 "),
        "owned by the sandbox user: {stdout}"
    );
    assert!(
        stdout.contains("changed\n") && stdout.ends_with("ok\n"),
        "{stdout}"
    );
    assert_eq!(
        std::fs::read_to_string(base.join("etc/config")).unwrap(),
        "original\n"
    );
    assert!(base.join("bin/ls").exists());
    assert!(!base.join("opt").exists());
}

/// A layer that contains another one is refused with a clear error rather than
/// stacking a tree inside itself.
#[test]
fn root_overlapping_layers_are_refused() {
    require_root!();
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base");
    shell_root(&base);
    let inner = base.join("inner");
    std::fs::create_dir_all(&inner).unwrap();
    let args = layer_args(&[base, inner]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run(&args, &["/bin/sh", "-c", "true"]);
    assert_eq!(out.status.code(), Some(125), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("overlap"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}
