//! Images: import of every source format, runs from an image, snapshots, diff, gc,
//! layer sharing and the loop-device fallback, attacked through the `brig` CLI.
//!
//! Every test has its own store in a temporary directory ([`Fixture`]); when the
//! test ends, even by a panic, the fixture removes its images and runs
//! `brig image gc --unmount`, and unmounts whatever that left, so no layer mount
//! outlives a test. The images are built here: a minimal tree holding dash and a
//! few coreutils with their shared libraries (no /usr), packed as each source
//! format needs.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

// Fixtures ------------------------------------------------------------------

/// Host binaries an image carries in /bin (dash becomes /bin/sh).
const TOOLS: &[&str] = &[
    "cat", "ls", "mkdir", "rm", "mv", "stat", "sleep", "true", "id", "ln",
];

/// A test's own store and scratch directory; cleans up the store when dropped.
struct Fixture {
    dir: tempfile::TempDir,
    store: PathBuf,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::Builder::new()
            .prefix("brig-images-test-")
            .tempdir()
            .expect("temp dir");
        // Sandboxes run as unprivileged host ids: let them reach workspaces in here.
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let store = dir.path().join("store");
        Fixture { dir, store }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// The minimal image tree (built on first use): /bin/sh and [`TOOLS`], their
    /// libraries, /data/greeting and an empty /etc.
    fn rootfs(&self) -> PathBuf {
        let root = self.path("rootfs");
        if !root.exists() {
            make_rootfs(&root);
        }
        root
    }

    /// A copy of the minimal tree to add files to.
    fn rootfs_copy(&self, name: &str) -> PathBuf {
        let copy = self.path(name);
        copy_tree(&self.rootfs(), &copy);
        copy
    }

    /// A directory every sandbox may write to (for --workspace and --bind).
    fn shared_dir(&self, name: &str) -> PathBuf {
        let dir = self.path(name);
        fs::create_dir_all(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
        dir
    }

    fn brig(&self) -> Command {
        let mut cmd = brig();
        cmd.env_remove("BRIG_LAYER_MOUNT")
            .env_remove("BRIG_STORE")
            .stdin(Stdio::null());
        cmd
    }

    /// `brig image ARGS --store STORE`.
    fn image_cmd(&self, args: &[&str]) -> Command {
        let mut cmd = self.brig();
        cmd.arg("image").args(args).arg("--store").arg(&self.store);
        cmd
    }

    fn image(&self, args: &[&str]) -> Output {
        self.image_cmd(args).output().expect("start brig image")
    }

    fn import(&self, name: &str, source: &Path) {
        let source = source.to_str().unwrap();
        ok(
            &self.image(&["import", name, source]),
            &format!("import {name}"),
        );
    }

    /// Imports the minimal tree as `name`.
    fn import_rootfs(&self, name: &str) {
        self.import(name, &self.rootfs());
    }

    /// `brig run --store STORE ARGS [-- CMD]`.
    fn run_cmd(&self, args: &[&str], cmd: &[&str]) -> Command {
        let mut command = self.brig();
        command
            .arg("run")
            .arg("--store")
            .arg(&self.store)
            .args(args);
        if !cmd.is_empty() {
            command.arg("--").args(cmd);
        }
        command
    }

    fn run(&self, args: &[&str], cmd: &[&str]) -> Output {
        self.run_cmd(args, cmd).output().expect("start brig run")
    }

    /// Runs a shell script in image `image`; asserts success, returns stdout.
    fn sh(&self, image: &str, args: &[&str], script: &str) -> String {
        let mut all = vec!["--image", image];
        all.extend_from_slice(args);
        ok(
            &self.run(&all, &["/bin/sh", "-c", script]),
            &format!("run in {image}: {script}"),
        )
    }

    fn run_json(&self, args: &[&str], cmd: &[&str]) -> Value {
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        let out = self.run(&all, cmd);
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "brig printed no JSON ({e}): stdout={} stderr={}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        })
    }

    fn inspect(&self, name: &str) -> Value {
        let out = ok(&self.image(&["inspect", name]), &format!("inspect {name}"));
        serde_json::from_str(&out).unwrap()
    }

    /// An image's layer digests (`sha256:<hex>`), bottom first.
    fn layers(&self, name: &str) -> Vec<String> {
        self.inspect(name)["layers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["digest"].as_str().unwrap().to_string())
            .collect()
    }

    fn image_names(&self) -> Vec<String> {
        let out = self.image(&["ls", "--json"]);
        serde_json::from_slice::<Value>(&out.stdout)
            .ok()
            .and_then(|v| v.as_array().cloned())
            .unwrap_or_default()
            .iter()
            .filter_map(|i| i["name"].as_str().map(String::from))
            .collect()
    }

    fn gc(&self, unmount: bool) -> Value {
        let mut args = vec!["gc", "--json"];
        if unmount {
            args.push("--unmount");
        }
        serde_json::from_str(&ok(&self.image(&args), "gc")).unwrap()
    }

    fn layer_file(&self, digest: &str) -> PathBuf {
        self.store
            .join("layers")
            .join(format!("{}.erofs", hex(digest)))
    }

    fn mount_point(&self, digest: &str) -> PathBuf {
        self.store.join("mnt").join(hex(digest))
    }

    /// Mount points on the host (this mount namespace) at or below the store.
    fn mounts(&self) -> Vec<PathBuf> {
        host_mounts()
            .into_iter()
            .filter(|m| m.point.starts_with(&self.store))
            .map(|m| m.point)
            .collect()
    }

    /// Loop devices whose backing file is in the store.
    fn loop_devices(&self) -> Vec<(String, String)> {
        loop_devices()
            .into_iter()
            .filter(|(_, file)| Path::new(file).starts_with(&self.store))
            .collect()
    }

    /// What a failed command must not change: names and contents of the image
    /// records, names and sizes of the layer files.
    fn state(&self) -> BTreeMap<String, String> {
        let mut state = BTreeMap::new();
        for dir in ["images", "layers"] {
            let Ok(entries) = fs::read_dir(self.store.join(dir)) else {
                continue;
            };
            for entry in entries.flatten() {
                let path = entry.path();
                let value = if dir == "images" || path.extension().is_some_and(|e| e == "json") {
                    sha256_hex(&fs::read(&path).unwrap_or_default())
                } else {
                    entry.metadata().map(|m| m.len()).unwrap_or(0).to_string()
                };
                state.insert(
                    format!("{dir}/{}", entry.file_name().to_string_lossy()),
                    value,
                );
            }
        }
        state
    }

    /// Work left in STORE/tmp: work directories and their lock files.
    fn tmp_debris(&self) -> Vec<String> {
        self.tmp_entries()
    }

    fn tmp_entries(&self) -> Vec<String> {
        fs::read_dir(self.store.join("tmp"))
            .map(|entries| {
                entries
                    .flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if !self.store.exists() {
            return;
        }
        for name in self.image_names() {
            let _ = self.image(&["rm", &name]);
        }
        let _ = self.image(&["gc", "--unmount"]);
        // Whatever gc could not unmount (a bug some test reports): no test may
        // leave a mount behind. Deepest first.
        let mut left = self.mounts();
        left.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
        for mount in left {
            eprintln!("fixture: unmounting {} left by brig", mount.display());
            let _ = Command::new("umount").arg("-l").arg(&mount).status();
        }
    }
}

/// A background `brig run`, killed if the test ends before it does.
struct Background(Option<Child>);

impl Background {
    fn spawn(mut cmd: Command) -> Background {
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        Background(Some(cmd.spawn().expect("start brig")))
    }

    fn pid(&self) -> u32 {
        self.0.as_ref().unwrap().id()
    }

    /// Whether the process has ended (it is reaped by [`Background::wait`]).
    fn exited(&mut self) -> bool {
        matches!(self.0.as_mut().unwrap().try_wait(), Ok(Some(_)))
    }

    fn wait(mut self) -> Output {
        self.0.take().unwrap().wait_with_output().unwrap()
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if let Some(child) = &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Asserts the command succeeded; returns its stdout.
#[track_caller]
fn ok(out: &Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what}: {}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Asserts brig refused with 125 and one `brig: ...` line; returns that line.
#[track_caller]
fn refused(out: &Output, what: &str) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(
        out.status.code(),
        Some(125),
        "{what}: expected brig to refuse with 125\nstdout: {}\nstderr: {stderr}",
        String::from_utf8_lossy(&out.stdout)
    );
    let lines: Vec<&str> = stderr.lines().collect();
    assert!(
        lines.len() == 1 && lines[0].starts_with("brig: ") && lines[0].len() > 10,
        "{what}: expected one `brig: ...` line, got {stderr:?}"
    );
    lines[0].to_string()
}

fn hex(digest: &str) -> &str {
    digest.strip_prefix("sha256:").expect("a sha256 digest")
}

fn sha256_hex(bytes: &[u8]) -> String {
    format!("{:x}", Sha256::digest(bytes))
}

fn file_sha256(path: &Path) -> String {
    sha256_hex(&fs::read(path).unwrap())
}

struct HostMount {
    point: PathBuf,
    fstype: String,
    source: String,
    /// The mount's own options ("ro,nosuid,nodev,relatime").
    options: String,
}

/// This mount namespace's mounts, from /proc/self/mountinfo.
fn host_mounts() -> Vec<HostMount> {
    let unescape = |s: &str| {
        s.replace("\\040", " ")
            .replace("\\011", "\t")
            .replace("\\012", "\n")
            .replace("\\134", "\\")
    };
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let point = left.split(' ').nth(4)?;
            let options = left.split(' ').nth(5)?.to_string();
            let mut right = right.split(' ');
            Some(HostMount {
                point: PathBuf::from(unescape(point)),
                options,
                fstype: right.next()?.to_string(),
                source: unescape(right.next()?),
            })
        })
        .collect()
}

/// Attached loop devices: (name, backing file).
fn loop_devices() -> Vec<(String, String)> {
    let mut found = Vec::new();
    for entry in fs::read_dir("/sys/block").unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Ok(file) = fs::read_to_string(entry.path().join("loop/backing_file")) {
            found.push((name, file.trim().to_string()));
        }
    }
    found
}

/// Copies a tree (symlinks dereferenced; the fixture trees have none).
fn copy_tree(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    fs::set_permissions(to, fs::metadata(from).unwrap().permissions()).unwrap();
    for entry in fs::read_dir(from).unwrap().flatten() {
        let dest = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &dest);
        } else {
            fs::copy(entry.path(), &dest).unwrap();
        }
    }
}

fn make_rootfs(root: &Path) {
    let bin = root.join("bin");
    fs::create_dir_all(&bin).unwrap();
    let mut libs = BTreeSet::new();
    let tools = std::iter::once(("sh", "dash")).chain(TOOLS.iter().map(|t| (*t, *t)));
    for (name, host_name) in tools {
        let host = Path::new("/usr/bin").join(host_name);
        fs::copy(&host, bin.join(name)).unwrap_or_else(|e| panic!("copy {host:?}: {e}"));
        let ldd = Command::new("ldd").arg(&host).output().expect("ldd");
        for token in String::from_utf8_lossy(&ldd.stdout).split_whitespace() {
            if token.starts_with('/') {
                libs.insert(token.to_string());
            }
        }
    }
    for lib in libs {
        let dest = root.join(lib.trim_start_matches('/'));
        fs::create_dir_all(dest.parent().unwrap()).unwrap();
        // fs::copy reads through symlinks: libc.so.6 arrives as a file.
        fs::copy(&lib, &dest).unwrap_or_else(|e| panic!("copy {lib}: {e}"));
    }
    fs::create_dir_all(root.join("etc")).unwrap();
    fs::create_dir_all(root.join("data")).unwrap();
    fs::write(root.join("data/greeting"), "hello from the image\n").unwrap();
    for dir in ["", "bin", "etc", "data"] {
        fs::set_permissions(root.join(dir), fs::Permissions::from_mode(0o755)).unwrap();
    }
}

// Archives --------------------------------------------------------------------

/// A tar stream built entry by entry (deterministic: owner 0, fixed mtimes).
struct Tar(tar::Builder<Vec<u8>>);

impl Tar {
    fn new() -> Tar {
        let mut builder = tar::Builder::new(Vec::new());
        builder.mode(tar::HeaderMode::Deterministic);
        builder.follow_symlinks(false);
        Tar(builder)
    }

    /// Every entry below `root`, directories before their contents.
    fn tree(mut self, root: &Path) -> Tar {
        self.add_tree(root, Path::new(""));
        self
    }

    fn add_tree(&mut self, root: &Path, rel: &Path) {
        let mut names: Vec<_> = fs::read_dir(root.join(rel))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        for name in names {
            let rel = rel.join(&name);
            let full = root.join(&rel);
            if full.symlink_metadata().unwrap().is_dir() {
                self.0.append_dir(&rel, &full).unwrap();
                self.add_tree(root, &rel);
            } else {
                self.0.append_path_with_name(&full, &rel).unwrap();
            }
        }
    }

    fn header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(kind);
        header.set_mode(mode);
        header.set_size(size);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(1_700_000_000);
        header
    }

    fn dir(mut self, path: &str) -> Tar {
        let mut header = Tar::header(tar::EntryType::Directory, 0o755, 0);
        header.set_path(path).unwrap();
        header.set_cksum();
        self.0.append(&header, std::io::empty()).unwrap();
        self
    }

    fn file(mut self, path: &str, data: &[u8]) -> Tar {
        let mut header = Tar::header(tar::EntryType::Regular, 0o644, data.len() as u64);
        header.set_path(path).unwrap();
        header.set_cksum();
        self.0.append(&header, data).unwrap();
        self
    }

    /// An entry written byte for byte, with no checks on its names (`..`,
    /// absolute paths, link targets anywhere).
    fn raw(mut self, name: &str, kind: tar::EntryType, link: &str, data: &[u8]) -> Tar {
        let mut header = Tar::header(kind, 0o644, data.len() as u64);
        let old = header.as_old_mut();
        assert!(name.len() < old.name.len() && link.len() < old.linkname.len());
        old.name[..name.len()].copy_from_slice(name.as_bytes());
        old.linkname[..link.len()].copy_from_slice(link.as_bytes());
        header.set_cksum();
        self.0.append(&header, data).unwrap();
        self
    }

    fn finish(self) -> Vec<u8> {
        self.0.into_inner().unwrap()
    }
}

#[derive(Clone, Copy)]
enum Compression {
    None,
    Gzip,
    Zstd,
}

impl Compression {
    fn apply(self, data: &[u8]) -> Vec<u8> {
        match self {
            Compression::None => data.to_vec(),
            Compression::Gzip => {
                let mut encoder =
                    flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
                encoder.write_all(data).unwrap();
                encoder.finish().unwrap()
            }
            Compression::Zstd => zstd::encode_all(data, 3).unwrap(),
        }
    }

    fn oci_media_type(self) -> &'static str {
        match self {
            Compression::None => "application/vnd.oci.image.layer.v1.tar",
            Compression::Gzip => "application/vnd.oci.image.layer.v1.tar+gzip",
            Compression::Zstd => "application/vnd.oci.image.layer.v1.tar+zstd",
        }
    }
}

fn oci_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// An image config blob: `run` is its `config` object; diff_ids are computed.
fn config_blob(run: &Value, layers: &[Vec<u8>]) -> Vec<u8> {
    let diff_ids: Vec<String> = layers
        .iter()
        .map(|l| format!("sha256:{}", sha256_hex(l)))
        .collect();
    serde_json::to_vec(&json!({
        "architecture": oci_arch(),
        "os": "linux",
        "config": run,
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "history": [],
    }))
    .unwrap()
}

/// Writes an OCI image layout at `dir`: layers (uncompressed tars, compressed as
/// given) bottom first, and the run config.
fn write_oci_layout(dir: &Path, layers: &[(Vec<u8>, Compression)], run: &Value) {
    let blobs = dir.join("blobs/sha256");
    fs::create_dir_all(&blobs).unwrap();
    let put = |bytes: &[u8]| -> (String, usize) {
        let hex = sha256_hex(bytes);
        fs::write(blobs.join(&hex), bytes).unwrap();
        (format!("sha256:{hex}"), bytes.len())
    };
    let tars: Vec<Vec<u8>> = layers.iter().map(|(t, _)| t.clone()).collect();
    let (config_digest, config_size) = put(&config_blob(run, &tars));
    let descriptors: Vec<Value> = layers
        .iter()
        .map(|(tar, compression)| {
            let (digest, size) = put(&compression.apply(tar));
            json!({"mediaType": compression.oci_media_type(), "digest": digest, "size": size})
        })
        .collect();
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": config_digest,
            "size": config_size,
        },
        "layers": descriptors,
    }))
    .unwrap();
    let (manifest_digest, manifest_size) = put(&manifest);
    let index = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest_digest,
            "size": manifest_size,
            "platform": {"architecture": oci_arch(), "os": "linux"},
            "annotations": {"org.opencontainers.image.ref.name": "latest"},
        }],
    });
    fs::write(dir.join("index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
    fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
}

/// A `docker save` archive in the classic layout (`<id>/layer.tar`,
/// `<config digest>.json`, `manifest.json`): layer ids are not content digests,
/// so brig checks the layers against the config's diff_ids.
fn docker_save(layers: &[Vec<u8>], run: &Value) -> Vec<u8> {
    let config = config_blob(run, layers);
    let config_name = format!("{}.json", sha256_hex(&config));
    let mut tar = Tar::new().file(&config_name, &config);
    let mut names = Vec::new();
    for (i, layer) in layers.iter().enumerate() {
        let id = sha256_hex(format!("layer id {i}").as_bytes());
        tar = tar
            .dir(&id)
            .file(&format!("{id}/VERSION"), b"1.0")
            .file(
                &format!("{id}/json"),
                format!(r#"{{"id":"{id}"}}"#).as_bytes(),
            )
            .file(&format!("{id}/layer.tar"), layer);
        names.push(format!("{id}/layer.tar"));
    }
    let manifest =
        json!([{"Config": config_name, "RepoTags": ["brig-test:latest"], "Layers": names}]);
    tar.file("manifest.json", &serde_json::to_vec(&manifest).unwrap())
        .file("repositories", br#"{"brig-test":{"latest":"x"}}"#)
        .finish()
}

/// The three layers of the config test images, uncompressed, bottom first:
/// the minimal tree; the workdir, a file in it and (docker) an /etc/passwd naming
/// the image's user; and a new /data/greeting.
fn three_layers(fx: &Fixture, passwd: Option<&str>) -> Vec<Vec<u8>> {
    let base = Tar::new().tree(&fx.rootfs()).finish();
    let mut second = Tar::new()
        .dir("srv")
        .dir("srv/app")
        .file("srv/app/hello.txt", b"hello from layer 2\n");
    if let Some(passwd) = passwd {
        second = second.dir("etc").file("etc/passwd", passwd.as_bytes());
    }
    let third = Tar::new()
        .dir("data")
        .file("data/greeting", b"greeting from layer 3\n");
    vec![base, second.finish(), third.finish()]
}

/// What the config test images' command prints, one fact per line.
const REPORT: &str = "echo cmd-ran; echo \"greeting=$GREETING\"; pwd; id -u; id -g; cat /srv/app/hello.txt /data/greeting";

fn expected_report(greeting: &str, uid: u32, gid: u32) -> String {
    format!(
        "cmd-ran\ngreeting={greeting}\n/srv/app\n{uid}\n{gid}\nhello from layer 2\ngreeting from layer 3\n"
    )
}

fn write_file(path: &Path, bytes: &[u8]) -> PathBuf {
    fs::write(path, bytes).unwrap();
    path.to_path_buf()
}

// 1. Every source format ---------------------------------------------------------

#[test]
fn root_import_directory_and_plain_gzip_zstd_tarballs_then_run_reads_their_files() {
    require_root!();
    let fx = Fixture::new();
    let tree = fx.rootfs_copy("tree");
    fs::write(tree.join("data/marker"), "from the source\n").unwrap();
    let tar = Tar::new().tree(&tree).finish();
    let sources = [
        ("from-dir", tree.clone()),
        ("from-tar", write_file(&fx.path("root.tar"), &tar)),
        (
            "from-tar-gz",
            write_file(&fx.path("root.tar.gz"), &Compression::Gzip.apply(&tar)),
        ),
        (
            "from-tar-zst",
            // No telling extension: brig must sniff the compression.
            write_file(&fx.path("root.archive"), &Compression::Zstd.apply(&tar)),
        ),
    ];
    let mut tar_layers = BTreeSet::new();
    for (name, source) in &sources {
        fx.import(name, source);
        let out = fx.sh(name, &[], "cat /data/marker /data/greeting; id -u; pwd");
        assert_eq!(
            out, "from the source\nhello from the image\n0\n/workspace\n",
            "image {name} (default user of an image without config: 0)"
        );
        let layers = fx.layers(name);
        assert_eq!(layers.len(), 1, "{name}: one layer");
        if *name != "from-dir" {
            tar_layers.extend(layers);
        }
    }
    // One tar, however compressed, is one tree: one layer, stored once.
    assert_eq!(tar_layers.len(), 1, "{tar_layers:?}");
    let listed = fx.image_names();
    for (name, _) in &sources {
        assert!(
            listed.contains(&name.to_string()),
            "{name} in ls: {listed:?}"
        );
    }
}

fn oci_config(greeting: &str) -> Value {
    json!({
        "Env": ["PATH=/bin", format!("GREETING={greeting}")],
        "User": "4321:4322",
        "WorkingDir": "/srv/app",
        "Cmd": ["/bin/sh", "-c", REPORT],
    })
}

/// Writes the three-layer OCI layout (gzip, zstd and plain layers) at `dir`.
fn three_layer_oci(fx: &Fixture, dir: &Path) {
    let layers = three_layers(fx, None);
    let compressions = [Compression::Gzip, Compression::Zstd, Compression::None];
    let layers: Vec<_> = layers.into_iter().zip(compressions).collect();
    write_oci_layout(dir, &layers, &oci_config("hello-oci"));
}

#[test]
fn root_import_oci_layout_directory_applies_layers_env_user_workdir_and_cmd() {
    require_root!();
    let fx = Fixture::new();
    let layout = fx.path("oci");
    three_layer_oci(&fx, &layout);
    fx.import("oci-dir", &layout);
    assert_eq!(fx.layers("oci-dir").len(), 3);
    // No command: the image's command runs, as its user, in its workdir, with its env.
    let out = ok(&fx.run(&["--image", "oci-dir"], &[]), "run the image's cmd");
    assert_eq!(out, expected_report("hello-oci", 4321, 4322));
    // Caller's flags win over the image's config.
    let out = fx.sh(
        "oci-dir",
        &[
            "--env",
            "GREETING=caller",
            "--user",
            "7:8",
            "--cwd",
            "/data",
        ],
        "echo $GREETING; id -u; id -g; pwd",
    );
    assert_eq!(out, "caller\n7\n8\n/data\n");
}

#[test]
fn root_import_oci_layout_tar_applies_layers_env_user_workdir_and_cmd() {
    require_root!();
    let fx = Fixture::new();
    let layout = fx.path("oci");
    three_layer_oci(&fx, &layout);
    let archive = write_file(
        &fx.path("image.oci.tar"),
        &Tar::new().tree(&layout).finish(),
    );
    fx.import("oci-tar", &archive);
    assert_eq!(fx.layers("oci-tar").len(), 3);
    let out = ok(&fx.run(&["--image", "oci-tar"], &[]), "run the image's cmd");
    assert_eq!(out, expected_report("hello-oci", 4321, 4322));
}

#[test]
fn root_import_docker_save_with_three_layers_applies_named_user_entrypoint_and_cmd() {
    require_root!();
    let fx = Fixture::new();
    let layers = three_layers(
        &fx,
        Some("root:x:0:0::/:/bin/sh\napp:x:4321:4322::/srv/app:/bin/sh\n"),
    );
    let run = json!({
        "Env": ["PATH=/bin", "GREETING=hello-docker"],
        "User": "app",
        "WorkingDir": "/srv/app",
        "Entrypoint": ["/bin/sh", "-c"],
        "Cmd": [REPORT],
    });
    let archive = write_file(&fx.path("image.docker.tar"), &docker_save(&layers, &run));
    fx.import("docker", &archive);
    let inspected = fx.inspect("docker");
    assert_eq!(
        inspected["layers"].as_array().unwrap().len(),
        3,
        "{inspected}"
    );
    let out = ok(&fx.run(&["--image", "docker"], &[]), "run entrypoint + cmd");
    // "app" is looked up in the image's /etc/passwd: 4321, primary group 4322.
    assert_eq!(out, expected_report("hello-docker", 4321, 4322));
}

// 2. Whiteouts and opaque directories ----------------------------------------------

/// A lower layer with /a/{x,keep} and /d/{1,2}; an upper one that whites out /a/x
/// and makes /d opaque with a new /d/3.
fn whiteout_layers(fx: &Fixture) -> Vec<Vec<u8>> {
    let lower = Tar::new()
        .tree(&fx.rootfs())
        .dir("a")
        .file("a/x", b"x\n")
        .file("a/keep", b"keep\n")
        .dir("d")
        .file("d/1", b"1\n")
        .file("d/2", b"2\n")
        .finish();
    let upper = Tar::new()
        .dir("a")
        .file("a/.wh.x", b"")
        .dir("d")
        .file("d/.wh..wh..opq", b"")
        .file("d/3", b"3\n")
        .finish();
    vec![lower, upper]
}

#[test]
fn root_whiteouts_and_opaque_dirs_hide_lower_files_in_oci_and_docker_images() {
    require_root!();
    let fx = Fixture::new();
    let layers = whiteout_layers(&fx);
    let layout = fx.path("oci");
    write_oci_layout(
        &layout,
        &[
            (layers[0].clone(), Compression::Gzip),
            (layers[1].clone(), Compression::Gzip),
        ],
        &json!({}),
    );
    fx.import("wh-oci", &layout);
    let archive = write_file(&fx.path("docker.tar"), &docker_save(&layers, &json!({})));
    fx.import("wh-docker", &archive);
    for image in ["wh-oci", "wh-docker"] {
        let out = fx.sh(
            image,
            &[],
            "echo a: $(ls -A /a); echo d: $(ls -A /d); cat /a/x 2>/dev/null || echo no-x; \
             cat /d/1 2>/dev/null || echo no-1; cat /d/3",
        );
        assert_eq!(out, "a: keep\nd: 3\nno-x\nno-1\n3\n", "image {image}");
    }
}

// 3. Snapshots ----------------------------------------------------------------------

/// The base image of the snapshot tests: the minimal tree plus some files to
/// change, delete and rename.
/// A whiteout is part of the layer's digest with its mtime: the entry's, so that
/// the same archive imported again is the same layer (and shares its file).
#[test]
fn root_an_archive_with_whiteouts_imported_twice_gives_the_same_layer() {
    require_root!();
    let fx = Fixture::new();
    let archive = Tar::new()
        .dir("a")
        .file("a/keep", b"keep\n")
        .file("a/.wh.gone", b"")
        .finish();
    let archive = write_file(&fx.path("whiteout.tar"), &archive);
    fx.import("first", &archive);
    // A second apart, in case only whole seconds of the import time showed.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    fx.import("second", &archive);
    assert_eq!(fx.layers("first"), fx.layers("second"));
}

fn import_snapshot_base(fx: &Fixture, name: &str) {
    let tree = fx.rootfs_copy("base");
    fs::write(tree.join("data/doomed"), "doomed\n").unwrap();
    fs::write(tree.join("data/old-name"), "renamed content\n").unwrap();
    fs::create_dir_all(tree.join("data/dir/sub")).unwrap();
    fs::write(tree.join("data/dir/sub/deep"), "deep\n").unwrap();
    fx.import(name, &tree);
}

fn diff_sets(fx: &Fixture, a: &str, b: &str) -> BTreeMap<char, BTreeSet<String>> {
    let out = ok(&fx.image(&["diff", a, b]), "diff");
    let mut sets: BTreeMap<char, BTreeSet<String>> = BTreeMap::new();
    for line in out.lines() {
        let (kind, path) = line.split_once(' ').expect("`K /path` lines");
        assert_eq!(kind.len(), 1, "{line}");
        sets.entry(kind.chars().next().unwrap())
            .or_default()
            .insert(path.to_string());
    }
    sets
}

fn set(paths: &[&str]) -> BTreeSet<String> {
    paths.iter().map(|p| p.to_string()).collect()
}

#[test]
fn root_snapshot_keeps_writes_deletions_and_renames_and_diff_lists_exactly_them() {
    require_root!();
    let fx = Fixture::new();
    import_snapshot_base(&fx, "base");
    fx.sh(
        "base",
        &["--snapshot-to", "after"],
        "set -e; echo new > /data/new-file; echo more >> /data/greeting; rm /data/doomed; \
         mv /data/old-name /data/new-name; mv /data/dir /data/moved; mkdir -p /made/inner; \
         echo ws > /workspace/result",
    );
    let out = fx.sh(
        "after",
        &[],
        "cat /data/new-file /data/greeting /data/new-name /data/moved/sub/deep /workspace/result; \
         for p in /data/doomed /data/old-name /data/dir; do [ -e $p ] && echo STILL-THERE $p; done; \
         [ -d /made/inner ] && echo made",
    );
    assert_eq!(
        out,
        "new\nhello from the image\nmore\nrenamed content\ndeep\nws\nmade\n"
    );
    // The base is untouched.
    let out = fx.sh(
        "base",
        &[],
        "cat /data/greeting /data/doomed /data/old-name; ls -A /data",
    );
    assert_eq!(
        out,
        "hello from the image\ndoomed\nrenamed content\ndir\ndoomed\ngreeting\nold-name\n"
    );

    let sets = diff_sets(&fx, "base", "after");
    let none = BTreeSet::new();
    assert_eq!(
        sets.get(&'A').unwrap_or(&none),
        &set(&[
            "/data/new-file",
            "/data/new-name",
            "/data/moved",
            "/data/moved/sub",
            "/data/moved/sub/deep",
            "/made",
            "/made/inner",
            "/workspace",
            "/workspace/result",
        ]),
        "added: {sets:?}"
    );
    assert_eq!(
        sets.get(&'D').unwrap_or(&none),
        &set(&[
            "/data/doomed",
            "/data/old-name",
            "/data/dir",
            "/data/dir/sub",
            "/data/dir/sub/deep",
        ]),
        "deleted: {sets:?}"
    );
    let changed = sets.get(&'C').unwrap_or(&none);
    assert!(changed.contains("/data/greeting"), "changed: {sets:?}");
    let allowed = set(&["/", "/data", "/data/greeting"]);
    assert!(changed.is_subset(&allowed), "changed: {sets:?}");
    assert_eq!(sets.len(), 3, "only A, C and D lines: {sets:?}");
    // And in the other direction, the opposite.
    let back = diff_sets(&fx, "after", "base");
    assert_eq!(back.get(&'A'), sets.get(&'D'));
    assert_eq!(back.get(&'D'), sets.get(&'A'));
}

#[test]
fn root_snapshot_of_a_run_that_writes_nothing_keeps_the_same_layers() {
    require_root!();
    let fx = Fixture::new();
    fx.import_rootfs("base");
    fx.sh(
        "base",
        &["--snapshot-to", "same"],
        "cat /data/greeting >/dev/null",
    );
    assert_eq!(fx.layers("same"), fx.layers("base"));
    assert_eq!(ok(&fx.image(&["diff", "base", "same"]), "diff"), "");
    // Writes to /tmp are not the image's.
    fx.sh(
        "base",
        &["--snapshot-to", "tmp-only"],
        "echo x > /tmp/scratch",
    );
    assert_eq!(fx.layers("tmp-only"), fx.layers("base"));
}

#[test]
fn root_snapshot_stores_files_written_by_the_default_user_as_image_root() {
    require_root!();
    let fx = Fixture::new();
    fx.import_rootfs("base");
    fx.sh(
        "base",
        &["--snapshot-to", "owned"],
        "id -u; echo mine > /data/mine; mkdir /data/mydir",
    );
    let out = fx.sh(
        "owned",
        &["--user", "0"],
        "stat -c '%u:%g %n' /data/mine /data/mydir",
    );
    assert_eq!(out, "0:0 /data/mine\n0:0 /data/mydir\n");
    // Also as stored: the new layer's files belong to uid 0, not to the host id the
    // sandbox ran as.
    let top = fx.layers("owned").pop().unwrap();
    let meta = fs::metadata(fx.mount_point(&top).join("data/mine")).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (0, 0));
}

#[test]
fn root_a_snapshotted_sandbox_cannot_point_brigs_cleanup_at_host_files() {
    require_root!();
    let fx = Fixture::new();
    // An image without /etc: brig makes the sandbox's in its writable layer, where
    // the sandbox may replace it.
    let tree = fx.rootfs_copy("no-etc");
    fs::remove_dir_all(tree.join("etc")).unwrap();
    fx.import("no-etc", &tree);
    // Empty host files of the names of brig's placeholders in /etc, which a
    // snapshot removes from the sandbox's writes when the image lacked them.
    let victim = fx.path("victim");
    fs::create_dir(&victim).unwrap();
    let names = ["group", "hostname", "hosts", "passwd", "resolv.conf"];
    for name in names {
        fs::write(victim.join(name), "").unwrap();
    }
    fx.sh(
        "no-etc",
        &["--snapshot-to", "after"],
        &format!("mv /etc /etc.old && ln -s {} /etc", victim.display()),
    );
    let mut left: Vec<String> = fs::read_dir(&victim)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    left.sort();
    assert_eq!(left, names, "the snapshot removed host files");
    assert_eq!(
        fx.layers("after").len(),
        2,
        "the sandbox's writes are a layer"
    );
}

#[test]
fn root_an_images_symlinks_cannot_lead_brig_to_host_files() {
    require_root!();
    let fx = Fixture::new();
    // Host databases that brig, reading the image's /etc/passwd and /etc/group as
    // root to add the sandbox's user, must never read.
    // Outside /tmp, which a sandbox gets a tmpfs of its own over.
    let host_dir = tempfile::Builder::new()
        .prefix("brig-images-test-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let host = host_dir.path().to_path_buf();
    fs::write(host.join("passwd"), "host-secret:x:4321:4321::/:/bin/sh\n").unwrap();
    fs::write(host.join("group"), "host-secret-group:x:4321:\n").unwrap();
    // The image's /etc climbs out of its layer's mount point to them. Inside the
    // sandbox the same link stays in the image, at a directory of its own.
    let tree = fx.rootfs_copy("linked-etc");
    fs::remove_dir_all(tree.join("etc")).unwrap();
    let inside = host.strip_prefix("/").unwrap();
    let own = tree.join(inside);
    fs::create_dir_all(&own).unwrap();
    fs::write(own.join("passwd"), "imageuser:x:4242:4242::/:/bin/sh\n").unwrap();
    std::os::unix::fs::symlink(
        "../".repeat(40) + inside.to_str().unwrap(),
        tree.join("etc"),
    )
    .unwrap();
    fx.import("linked-etc", &tree);
    let out = fx.sh("linked-etc", &[], "cat /etc/passwd /etc/group");
    assert!(!out.contains("host-secret"), "{out}");
    assert!(
        out.contains("root:x:0:0"),
        "brig still names the sandbox's user: {out}"
    );
}

// 4. Bad input changes nothing ---------------------------------------------------------

/// Runs `attempt`, which must be refused with 125, and checks the store is as it
/// was and no work is left in STORE/tmp. Returns brig's message.
#[track_caller]
fn refused_without_change(fx: &Fixture, what: &str, attempt: impl FnOnce() -> Output) -> String {
    let before = fx.state();
    let message = refused(&attempt(), what);
    assert_eq!(fx.state(), before, "{what}: the store changed");
    assert_eq!(
        fx.tmp_debris(),
        Vec::<String>::new(),
        "{what}: work left in tmp"
    );
    assert_eq!(fx.mounts().len(), 0, "{what}: a mount was left");
    message
}

#[test]
fn root_path_escaping_tars_are_refused_and_write_nothing_outside() {
    require_root!();
    let fx = Fixture::new();
    fx.import_rootfs("existing");
    ok(&fx.image(&["gc", "--unmount"]), "gc");
    let canary = fx.path("canary");
    fs::create_dir(&canary).unwrap();
    fs::write(fx.path("secret"), "host secret\n").unwrap();
    let canary_abs = canary.to_str().unwrap().to_string();
    let canary_rel = canary_abs.trim_start_matches('/');
    // Deeper than any staging directory: STORE/tmp/<work>/staging/layer-0/data.
    let up = "../".repeat(12);
    use tar::EntryType::{Link, Regular, Symlink};
    let attacks: Vec<(&str, Vec<u8>)> = vec![
        (
            "dot-dot",
            Tar::new()
                .dir("data")
                .raw(
                    &format!("data/{up}{canary_rel}/dotdot"),
                    Regular,
                    "",
                    b"evil",
                )
                .finish(),
        ),
        (
            "absolute",
            Tar::new()
                .raw(&format!("{canary_abs}/absolute"), Regular, "", b"evil")
                .finish(),
        ),
        (
            "through an absolute symlink",
            Tar::new()
                .raw("escape", Symlink, &canary_abs, b"")
                .raw("escape/via-symlink", Regular, "", b"evil")
                .finish(),
        ),
        (
            "through a relative symlink",
            Tar::new()
                .dir("data")
                .raw("data/up", Symlink, up.trim_end_matches('/'), b"")
                .raw(
                    &format!("data/up/{canary_rel}/via-relative"),
                    Regular,
                    "",
                    b"evil",
                )
                .finish(),
        ),
        (
            "symlink then a directory through it",
            Tar::new()
                .raw("escape", Symlink, &canary_abs, b"")
                .raw("escape/newdir/", tar::EntryType::Directory, "", b"")
                .finish(),
        ),
        (
            "hard link to an absolute path",
            Tar::new()
                .raw("leak", Link, fx.path("secret").to_str().unwrap(), b"")
                .finish(),
        ),
        (
            "hard link through a symlink",
            Tar::new()
                .raw("outside", Symlink, fx.dir.path().to_str().unwrap(), b"")
                .raw("leak", Link, "outside/secret", b"")
                .finish(),
        ),
    ];
    for (i, (what, tar)) in attacks.iter().enumerate() {
        let archive = write_file(&fx.path(&format!("evil-{i}.tar")), tar);
        let message = refused_without_change(&fx, what, || {
            fx.image(&["import", &format!("evil-{i}"), archive.to_str().unwrap()])
        });
        eprintln!("{what}: {message}");
        let left: Vec<_> = fs::read_dir(&canary).unwrap().flatten().collect();
        assert!(left.is_empty(), "{what}: wrote outside: {left:?}");
        assert_eq!(
            fs::read_to_string(fx.path("secret")).unwrap(),
            "host secret\n"
        );
    }

    // Across layers: a symlink in one layer and a file "below" it in the next
    // must not write outside either (each layer unpacks on its own).
    let lower = Tar::new()
        .tree(&fx.rootfs())
        .raw("escape", Symlink, &canary_abs, b"")
        .finish();
    let upper = Tar::new()
        .raw("escape/cross-layer", Regular, "", b"evil")
        .finish();
    let layout = fx.path("cross-layer-oci");
    write_oci_layout(
        &layout,
        &[(lower, Compression::None), (upper, Compression::None)],
        &json!({}),
    );
    let out = fx.image(&["import", "cross", layout.to_str().unwrap()]);
    if out.status.success() {
        // The upper layer's directory hides the lower layer's symlink.
        fx.sh("cross", &[], "cat /escape/cross-layer");
    }
    let left: Vec<_> = fs::read_dir(&canary).unwrap().flatten().collect();
    assert!(
        left.is_empty(),
        "cross-layer symlink wrote outside: {left:?}"
    );
}

#[test]
fn root_oci_layout_symlinks_leading_out_of_the_layout_are_refused() {
    require_root!();
    let fx = Fixture::new();
    fx.import_rootfs("existing");
    ok(&fx.image(&["gc", "--unmount"]), "gc");
    let layers = vec![(Tar::new().tree(&fx.rootfs()).finish(), Compression::Gzip)];
    // Valid content, but reached through a symlink to a host path outside the
    // layout: brig (root) must not read host files on the source's say-so.
    let outside = fx.path("outside");
    fs::create_dir(&outside).unwrap();
    for victim in ["index.json", "blob"] {
        let layout = fx.path(&format!("oci-{victim}"));
        write_oci_layout(&layout, &layers, &json!({}));
        let target = if victim == "index.json" {
            layout.join("index.json")
        } else {
            let manifest_index: Value =
                serde_json::from_slice(&fs::read(layout.join("index.json")).unwrap()).unwrap();
            let manifest = manifest_index["manifests"][0]["digest"].as_str().unwrap();
            let manifest: Value = serde_json::from_slice(
                &fs::read(layout.join("blobs/sha256").join(hex(manifest))).unwrap(),
            )
            .unwrap();
            let layer = manifest["layers"][0]["digest"].as_str().unwrap();
            layout.join("blobs/sha256").join(hex(layer))
        };
        let moved = outside.join(format!("{victim}-moved"));
        fs::rename(&target, &moved).unwrap();
        std::os::unix::fs::symlink(&moved, &target).unwrap();
        let message = refused_without_change(&fx, &format!("{victim} symlinked out"), || {
            fx.image(&["import", "linked", layout.to_str().unwrap()])
        });
        assert!(message.contains("outside"), "{victim}: {message}");
    }
}

/// `brig run` stacks at most 500 layers and never one layer twice: import refuses
/// such images rather than storing one no sandbox can start from.
#[test]
fn root_images_too_tall_or_with_a_layer_twice_are_refused_at_import() {
    require_root!();
    let fx = Fixture::new();
    let base = Tar::new().tree(&fx.rootfs()).finish();
    let tall: Vec<_> = std::iter::once(base.clone())
        .chain((0..500).map(|i| Tar::new().file(&format!("f{i}"), b"x").finish()))
        .map(|tar| (tar, Compression::None))
        .collect();
    let layout = fx.path("oci-tall");
    write_oci_layout(&layout, &tall, &json!({}));
    let message = refused_without_change(&fx, "501 layers", || {
        fx.image(&["import", "tall", layout.to_str().unwrap()])
    });
    assert!(message.contains("501 layers"), "{message}");

    let extra = Tar::new().dir("data").file("data/extra", b"x").finish();
    let twice: Vec<_> = [base.clone(), extra, base]
        .into_iter()
        .map(|tar| (tar, Compression::None))
        .collect();
    let layout = fx.path("oci-twice");
    write_oci_layout(&layout, &twice, &json!({}));
    let message = refused(
        &fx.image(&["import", "twice", layout.to_str().unwrap()]),
        "a layer twice",
    );
    assert!(message.contains("twice"), "{message}");
    assert_eq!(fx.image_names(), Vec::<String>::new());
}

/// A store written by a brig from before that check can hold such images: using one
/// is refused with the reason (the daemon answered 500, `brig run` a mount failure),
/// and it can still be removed.
#[test]
fn root_a_stored_image_with_a_layer_twice_is_refused_where_it_is_used() {
    require_root!();
    let fx = Fixture::new();
    ok(
        &fx.image(&["import", "good", fx.rootfs().to_str().unwrap()]),
        "import",
    );
    let images = fx.store.join("images");
    let mut record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(images.join("good.json")).unwrap()).unwrap();
    let layer = record["layers"][0].clone();
    record["layers"] = json!([layer.clone(), layer]);
    std::fs::write(images.join("old.json"), record.to_string()).unwrap();

    let out = fx
        .brig()
        .args(["run", "--store"])
        .arg(&fx.store)
        .args(["--image", "old", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("twice"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");

    let data = fx.path("daemon-data");
    let d = common::daemon::Daemon::start_in(&data, &fx.store, &[]);
    let key = d.admin_key().to_string();
    let (status, body) = d.request(
        "POST",
        "/v1/sessions",
        Some(&key),
        Some(json!({"image": "old"})),
    );
    assert_eq!(status, 422, "{body}");
    assert!(
        body["error"]["message"].as_str().unwrap().contains("twice"),
        "{body}"
    );
    drop(d);

    ok(&fx.image(&["rm", "old"]), "remove the old image");
    assert_eq!(fx.image_names(), ["good"]);
}

/// `--store` relative to the current directory, for import as for run (whose
/// sandbox spec takes the layers' mount points, absolute host paths only).
#[test]
fn root_a_relative_store_works_for_import_and_run() {
    require_root!();
    let fx = Fixture::new();
    let rootfs = fx.rootfs();
    let (dir, store) = (fx.store.parent().unwrap(), fx.store.file_name().unwrap());
    let relative = |command: &[&str], args: &[&str]| {
        fx.brig()
            .current_dir(dir)
            .args(command)
            .arg("--store")
            .arg(store)
            .args(args)
            .output()
            .unwrap()
    };
    ok(
        &relative(&["image", "import"], &["rel", rootfs.to_str().unwrap()]),
        "import into a relative store",
    );
    let cat = ["--image", "rel", "--", "/bin/cat", "/data/greeting"];
    let out = relative(&["run"], &cat);
    assert_eq!(
        ok(&out, "run from a relative store"),
        "hello from the image\n"
    );
    assert_eq!(fx.image_names(), ["rel"]);
}

#[test]
fn root_corrupt_or_truncated_layer_file_is_refused_at_run() {
    require_root!();
    let fx = Fixture::new();
    fx.import_rootfs("victim");
    fx.sh("victim", &[], "true");
    let digest = fx.layers("victim").remove(0);
    let file = fx.layer_file(&digest);
    let good = fs::read(&file).unwrap();

    let mut flipped = good.clone();
    let middle = flipped.len() / 2;
    for byte in &mut flipped[middle..middle + 16] {
        *byte ^= 0xff;
    }
    let truncated = good[..good.len() / 2].to_vec();
    for (what, bytes) in [("flipped bytes", flipped), ("truncated", truncated)] {
        let gc = fx.gc(true);
        assert_eq!(fx.mounts().len(), 0, "unmounted before damaging: {gc}");
        fs::write(&file, &bytes).unwrap();
        let out = fx.run(&["--image", "victim"], &["/bin/sh", "-c", "echo RAN"]);
        let message = refused(&out, what);
        assert!(message.contains("corrupt"), "{what}: {message}");
        assert!(!String::from_utf8_lossy(&out.stdout).contains("RAN"));
        assert_eq!(fx.mounts().len(), 0, "{what}: a damaged layer was mounted");
    }
    // Repaired, it runs again.
    fs::write(&file, &good).unwrap();
    assert_eq!(
        fx.sh("victim", &[], "cat /data/greeting"),
        "hello from the image\n"
    );
}

#[test]
fn root_corrupt_or_truncated_gzip_import_fails_and_changes_nothing() {
    require_root!();
    let fx = Fixture::new();
    fx.import_rootfs("existing");
    ok(&fx.image(&["gc", "--unmount"]), "gc");
    let gz = Compression::Gzip.apply(&Tar::new().tree(&fx.rootfs()).finish());
    let mut flipped = gz.clone();
    let middle = flipped.len() / 2;
    for byte in &mut flipped[middle..middle + 64] {
        *byte = byte.wrapping_add(0x55);
    }
    let truncated = gz[..gz.len() * 2 / 3].to_vec();
    let mut bad_trailer = gz.clone();
    let crc = bad_trailer.len() - 8;
    bad_trailer[crc] ^= 1;
    for (what, bytes) in [
        ("flipped bytes", flipped),
        ("truncated", truncated),
        ("bad crc", bad_trailer),
    ] {
        let archive = write_file(&fx.path("bad.tar.gz"), &bytes);
        refused_without_change(&fx, what, || {
            fx.image(&["import", "bad", archive.to_str().unwrap()])
        });
    }
}

#[test]
fn root_import_to_an_existing_name_needs_replace() {
    require_root!();
    let fx = Fixture::new();
    fx.import_rootfs("taken");
    ok(&fx.image(&["gc", "--unmount"]), "gc");
    let other = fx.rootfs_copy("other");
    fs::write(other.join("data/greeting"), "replaced\n").unwrap();
    let message = refused_without_change(&fx, "import over an existing name", || {
        fx.image(&["import", "taken", other.to_str().unwrap()])
    });
    assert!(message.contains("taken"), "{message}");
    assert_eq!(
        fx.sh("taken", &[], "cat /data/greeting"),
        "hello from the image\n"
    );
    ok(
        &fx.image(&["import", "--replace", "taken", other.to_str().unwrap()]),
        "import --replace",
    );
    assert_eq!(fx.sh("taken", &[], "cat /data/greeting"), "replaced\n");
}

#[test]
fn root_bad_image_names_are_refused_everywhere() {
    require_root!();
    let fx = Fixture::new();
    fx.import_rootfs("good");
    ok(&fx.image(&["gc", "--unmount"]), "gc");
    let source = fx.rootfs();
    let long = "a".repeat(129);
    let marker_dir = fx.shared_dir("ws");
    let ws = marker_dir.to_str().unwrap();
    for name in [
        "",
        "bad name",
        "../escape",
        ".hidden",
        "semi;colon",
        "star*",
        long.as_str(),
    ] {
        refused_without_change(&fx, &format!("import {name:?}"), || {
            fx.image(&["import", name, source.to_str().unwrap()])
        });
        refused_without_change(&fx, &format!("run --image {name:?}"), || {
            fx.run(&["--image", name], &["true"])
        });
        refused_without_change(&fx, &format!("run --snapshot-to {name:?}"), || {
            fx.run(
                &["--image", "good", "--snapshot-to", name, "--workspace", ws],
                &["/bin/sh", "-c", "echo ran > /workspace/marker"],
            )
        });
        assert!(
            !marker_dir.join("marker").exists(),
            "the command ran with --snapshot-to {name:?}"
        );
        refused_without_change(&fx, &format!("rm {name:?}"), || fx.image(&["rm", name]));
    }
    // Nothing appeared outside the store either.
    let entries: BTreeSet<String> = fs::read_dir(fx.dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(entries, set(&["rootfs", "store", "ws"]));
    assert_eq!(fx.image_names(), vec!["good".to_string()]);
}

#[test]
fn root_snapshot_to_an_existing_name_fails_before_the_command_runs() {
    require_root!();
    let fx = Fixture::new();
    fx.import_rootfs("base");
    fx.sh(
        "base",
        &["--snapshot-to", "taken"],
        "echo first > /data/first",
    );
    ok(&fx.image(&["gc", "--unmount"]), "gc");
    let ws_dir = fx.shared_dir("ws");
    let ws = ws_dir.to_str().unwrap();
    let message = refused_without_change(&fx, "snapshot over an existing name", || {
        fx.run(
            &[
                "--image",
                "base",
                "--snapshot-to",
                "taken",
                "--workspace",
                ws,
            ],
            &[
                "/bin/sh",
                "-c",
                "echo ran > /workspace/marker; echo second > /data/second",
            ],
        )
    });
    assert!(message.contains("taken"), "{message}");
    assert!(!ws_dir.join("marker").exists(), "the command ran");
    assert_eq!(
        fx.sh("taken", &[], "cat /data/first; ls /data"),
        "first\nfirst\ngreeting\n"
    );
    // With --replace it runs and replaces.
    fx.sh(
        "base",
        &["--snapshot-to", "taken", "--replace", "--workspace", ws],
        "echo ran > /workspace/marker; echo second > /data/second",
    );
    assert!(ws_dir.join("marker").exists());
    assert_eq!(fx.sh("taken", &[], "ls /data"), "greeting\nsecond\n");
}

// 5. Interrupts ------------------------------------------------------------------------

/// mkfs.erofs processes working for this store.
fn mkfs_of(fx: &Fixture) -> Vec<u32> {
    processes_with("mkfs.erofs")
        .into_iter()
        .filter(|pid| {
            fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(fx.store.to_str().unwrap()))
                .unwrap_or(false)
        })
        .collect()
}

#[test]
fn root_interrupted_import_leaves_no_image_no_work_and_no_mkfs() {
    require_root!();
    let fx = Fixture::new();
    // Incompressible data: mkfs.erofs -zlz4 packs it at ~70 MiB/s here, so 384 MiB
    // keeps it busy for seconds, long enough to be caught in the act.
    let src = fx.path("big");
    fs::create_dir(&src).unwrap();
    let mut random = fs::File::open("/dev/urandom").unwrap();
    for i in 0..6 {
        let mut file = fs::File::create(src.join(format!("blob-{i}"))).unwrap();
        std::io::copy(&mut (&mut random).take(64 << 20), &mut file).unwrap();
    }
    let tar_path = fx.path("big.tar");
    {
        let mut builder = tar::Builder::new(fs::File::create(&tar_path).unwrap());
        builder.append_dir_all("big", &src).unwrap();
        builder.finish().unwrap();
    }
    fs::remove_dir_all(&src).unwrap();
    let tar_arg = tar_path.to_str().unwrap();

    type Ready = Box<dyn Fn(&Fixture) -> bool>;
    let moments: [(&str, Ready); 2] = [
        (
            "as soon as its work directory exists",
            Box::new(|fx: &Fixture| fx.tmp_entries().iter().any(|e| !e.ends_with(".lock"))),
        ),
        (
            "while mkfs.erofs packs",
            Box::new(|fx: &Fixture| !mkfs_of(fx).is_empty()),
        ),
    ];
    for (when, ready) in moments {
        let import = Background::spawn(fx.image_cmd(&["import", "big", tar_arg]));
        assert!(
            eventually(60_000, || ready(&fx)),
            "interrupt {when}: never got there"
        );
        send_signal(import.pid(), "INT");
        let started = Instant::now();
        let out = import.wait();
        assert!(
            !out.status.success(),
            "interrupted {when}, the import succeeded: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // Stopped at the interrupt, not at the import's end (which would succeed);
        // the bound only guards against it being waited for meanwhile.
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "interrupt {when}: took {:?} to stop",
            started.elapsed()
        );
        let images: Vec<_> = fs::read_dir(fx.store.join("images")).unwrap().collect();
        assert!(images.is_empty(), "interrupt {when}: an image was made");
        assert_eq!(fx.tmp_debris(), Vec::<String>::new(), "interrupt {when}");
        assert!(
            eventually(60_000, || mkfs_of(&fx).is_empty()),
            "interrupt {when}: mkfs.erofs still runs: {:?}",
            mkfs_of(&fx)
        );
        assert_eq!(fx.mounts().len(), 0);
    }
}

/// Starts a snapshot run that writes 48 MiB of random data (packing it takes
/// mkfs.erofs many seconds) and waits until mkfs.erofs packs it.
fn snapshot_being_packed(fx: &Fixture) -> Background {
    let run = Background::spawn(fx.run_cmd(
        &["--image", "base", "--snapshot-to", "snap", "--disk", "48M"],
        &[
            "/bin/sh",
            "-c",
            "cat /dev/urandom > /data/random 2>/dev/null; true",
        ],
    ));
    assert!(
        eventually(60_000, || !mkfs_of(fx).is_empty()),
        "the snapshot never reached mkfs.erofs"
    );
    run
}

#[test]
fn root_interrupted_snapshot_leaves_no_image_no_work_and_no_mount() {
    require_root!();
    let fx = Fixture::new();
    fx.import_rootfs("base");
    let run = snapshot_being_packed(&fx);
    send_signal(run.pid(), "INT");
    let out = run.wait();
    let message = refused(&out, "interrupted snapshot");
    assert!(message.contains("interrupted"), "{message}");
    assert_eq!(fx.image_names(), vec!["base".to_string()]);
    assert_eq!(fx.tmp_debris(), Vec::<String>::new());
    assert!(
        eventually(60_000, || mkfs_of(&fx).is_empty()),
        "mkfs.erofs left running"
    );
    let layer_mounts: Vec<PathBuf> = fx
        .layers("base")
        .iter()
        .map(|l| fx.mount_point(l))
        .collect();
    assert_eq!(
        fx.mounts(),
        layer_mounts,
        "only the base layer stays mounted"
    );
}

#[test]
fn root_brig_killed_while_packing_a_snapshot_leaves_no_mount_or_process_behind() {
    require_root!();
    let fx = Fixture::new();
    fx.import_rootfs("base");
    let run = snapshot_being_packed(&fx);
    send_signal(run.pid(), "KILL");
    assert!(!run.wait().status.success());
    let mkfs_gone = eventually(60_000, || mkfs_of(&fx).is_empty());
    let orphans = mkfs_of(&fx);
    for pid in &orphans {
        send_signal(*pid, "KILL");
    }
    // The next brig to open the store clears the dead snapshot's work.
    assert_eq!(fx.image_names(), vec!["base".to_string()]);
    let layer_mounts: Vec<PathBuf> = fx
        .layers("base")
        .iter()
        .map(|l| fx.mount_point(l))
        .collect();
    assert_eq!(
        fx.mounts(),
        layer_mounts,
        "only the base layer stays mounted"
    );
    assert_eq!(fx.tmp_debris(), Vec::<String>::new());
    assert!(
        mkfs_gone,
        "mkfs.erofs kept running after brig died: {orphans:?}"
    );
}

// 6. gc ------------------------------------------------------------------------------

#[test]
fn root_gc_removes_unreferenced_layers_but_never_one_a_sandbox_uses() {
    require_root!();
    let fx = Fixture::new();
    // An unreferenced layer goes.
    let other = fx.rootfs_copy("other");
    fs::write(other.join("data/other"), "other\n").unwrap();
    fx.import("unused", &other);
    let unused = fx.layers("unused").remove(0);
    ok(&fx.image(&["rm", "unused"]), "rm");
    let gc = fx.gc(false);
    assert_eq!(gc["removed_layers"], json!([unused]), "{gc}");
    assert!(!fx.layer_file(&unused).exists());

    // A layer in use stays, even when no image names it any more.
    fx.import_rootfs("busy");
    let layer = fx.layers("busy").remove(0);
    let ws_dir = fx.shared_dir("ws");
    let run = Background::spawn(fx.run_cmd(
        &["--image", "busy", "--workspace", ws_dir.to_str().unwrap()],
        &[
            "/bin/sh",
            "-c",
            // Runs until the test has run gc (however long that takes).
            "echo up > /workspace/up; while [ ! -e /workspace/go ]; do sleep 0.02; done; \
             cat /data/greeting",
        ],
    ));
    assert!(
        eventually(60_000, || ws_dir.join("up").exists()),
        "the sandbox never started"
    );
    ok(&fx.image(&["rm", "busy"]), "rm busy");
    for unmount in [false, true] {
        let gc = fx.gc(unmount);
        assert_eq!(gc["in_use"], json!([layer]), "gc --unmount={unmount}: {gc}");
        assert_eq!(gc["removed_layers"], json!([]), "{gc}");
        assert!(fx.layer_file(&layer).exists());
        assert!(fx.mounts().contains(&fx.mount_point(&layer)));
    }
    fs::write(ws_dir.join("go"), b"").unwrap();
    let out = run.wait();
    assert_eq!(ok(&out, "the run during gc"), "hello from the image\n");
    // Now nothing uses it.
    let gc = fx.gc(false);
    assert_eq!(gc["removed_layers"], json!([layer]), "{gc}");
    assert!(!fx.layer_file(&layer).exists());
    assert_eq!(fx.mounts().len(), 0, "removed layers are unmounted");
}

#[test]
fn root_gc_while_another_image_runs_in_a_loop_breaks_no_run() {
    require_root!();
    let fx = Fixture::new();
    fx.import_rootfs("steady");
    let churn = fx.rootfs_copy("churn");
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        let runners: Vec<_> = (0..2)
            .map(|_| {
                scope.spawn(|| {
                    for _ in 0..8 {
                        let out = fx.run(
                            &["--image", "steady"],
                            &["/bin/sh", "-c", "cat /data/greeting; ls /bin >/dev/null"],
                        );
                        let text = ok(&out, "a run while gc runs");
                        assert!(text.starts_with("hello from the image\n"), "{text}");
                    }
                })
            })
            .collect();
        let collector = scope.spawn(|| {
            let mut rounds = 0u32;
            let mut unmount = false;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                rounds += 1;
                // A fresh layer each time, removed again by gc; every other gc also
                // unmounts idle layers, the running image's included when idle.
                fs::write(churn.join("data/round"), rounds.to_string()).unwrap();
                fx.import("churn", &churn);
                ok(&fx.image(&["rm", "churn"]), "rm churn");
                unmount = !unmount;
                let gc = fx.gc(unmount);
                assert_eq!(gc["removed_layers"].as_array().unwrap().len(), 1, "{gc}");
            }
            rounds
        });
        for runner in runners {
            runner.join().expect("a run failed while gc ran");
        }
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        let rounds = collector.join().unwrap();
        assert!(rounds >= 1);
    });
    assert_eq!(
        fx.sh("steady", &[], "cat /data/greeting"),
        "hello from the image\n"
    );
}

// 7. Sharing ------------------------------------------------------------------------

#[test]
fn root_twenty_concurrent_sandboxes_share_one_mount_per_layer() {
    require_root!();
    let fx = Fixture::new();
    fx.import_rootfs("base");
    fx.sh("base", &["--snapshot-to", "two"], "echo top > /data/top");
    ok(&fx.image(&["gc", "--unmount"]), "gc");
    let layers = fx.layers("two");
    assert_eq!(layers.len(), 2);
    let shared = fx.shared_dir("shared");
    let bind = format!("{}:/shared:rw", shared.display());
    let runs: Vec<Background> = (0..20)
        .map(|i| {
            let n = i.to_string();
            Background::spawn(fx.run_cmd(
                &["--image", "two", "--bind", &bind, "--timeout", "90s"],
                &[
                    "/bin/sh",
                    "-c",
                    "cat /data/top > /shared/up-$1; while [ ! -e /shared/go ]; do sleep 0.2; done; cat /data/greeting",
                    "sh",
                    &n,
                ],
            ))
        })
        .collect();
    let all_up = || {
        fs::read_dir(&shared)
            .map(|d| d.flatten().count() >= 20)
            .unwrap_or(false)
    };
    assert!(eventually(60_000, all_up), "not all 20 sandboxes started");
    let mounts = fx.mounts();
    let expected: Vec<PathBuf> = layers.iter().map(|l| fx.mount_point(l)).collect();
    let mut sorted_mounts = mounts.clone();
    sorted_mounts.sort();
    let mut sorted_expected = expected.clone();
    sorted_expected.sort();
    assert_eq!(
        sorted_mounts, sorted_expected,
        "exactly one host mount per layer while 20 sandboxes run"
    );
    fs::write(shared.join("go"), "").unwrap();
    for run in runs {
        assert_eq!(ok(&run.wait(), "one of 20"), "hello from the image\n");
    }
    for i in 0..20 {
        assert_eq!(
            fs::read_to_string(shared.join(format!("up-{i}"))).unwrap(),
            "top\n"
        );
    }
}

/// Maps the file named by its argument, touches every page, then advises
/// `MADV_PAGEOUT` and `MADV_COLD` over the mapping; prints each result (0 or an errno).
/// Image sandboxes have no Python, hence C.
const PAGEOUT_C: &str = "#include <errno.h>\n\
    #include <fcntl.h>\n\
    #include <stdio.h>\n\
    #include <sys/mman.h>\n\
    #include <sys/stat.h>\n\
    int main(int argc, char **argv) {\n\
        struct stat st;\n\
        int fd = argc > 1 ? open(argv[1], O_RDONLY) : -1;\n\
        if (fd < 0 || fstat(fd, &st) != 0) { perror(\"open\"); return 1; }\n\
        volatile char *map = mmap(0, st.st_size, PROT_READ, MAP_SHARED, fd, 0);\n\
        if (map == MAP_FAILED) { perror(\"mmap\"); return 1; }\n\
        unsigned sum = 0;\n\
        for (off_t at = 0; at < st.st_size; at += 4096) sum += map[at];\n\
        /* 21 is MADV_PAGEOUT, 20 MADV_COLD (Linux 5.4). */\n\
        int pageout = madvise((void *)map, st.st_size, 21) == 0 ? 0 : errno;\n\
        int cold = madvise((void *)map, st.st_size, 20) == 0 ? 0 : errno;\n\
        printf(\"pageout %d\\ncold %d\\n\", pageout, cold);\n\
        return sum == 1;\n\
    }\n";

/// Compiles `source` with gcc into `binary`; false (the test is skipped) without gcc.
fn compile_c(source: &str, binary: &Path) -> bool {
    let file = binary.with_extension("c");
    fs::write(&file, source).unwrap();
    match Command::new("gcc")
        .arg("-O1")
        .arg("-o")
        .arg(binary)
        .arg(&file)
        .output()
    {
        Ok(out) => {
            assert!(
                out.status.success(),
                "gcc: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            true
        }
        Err(err) => {
            eprintln!("skipped: no gcc ({err})");
            false
        }
    }
}

/// Bytes of `path` in the host's page cache, as the host sees it (fincore, as root).
fn cached_bytes(path: &Path) -> u64 {
    let out = Command::new("fincore")
        .args(["--bytes", "--noheadings", "--output", "RES"])
        .arg(path)
        .output()
        .expect("fincore (util-linux)");
    let text = String::from_utf8_lossy(&out.stdout);
    text.trim()
        .parse()
        .unwrap_or_else(|_| panic!("fincore: {text} {}", String::from_utf8_lossy(&out.stderr)))
}

#[test]
fn root_an_image_sandbox_cannot_page_out_the_layers_it_shares() {
    require_root!();
    // A layer is mounted once on the host and shared by every sandbox, idmapped so that
    // the sandbox owns its files. The kernel pages out (MADV_PAGEOUT) or deactivates
    // (MADV_COLD) the file pages of a mapping whose file the caller owns: without brig's
    // filter one sandbox evicted most of a shared numpy library, for every other one.
    let fx = Fixture::new();
    let root = fx.rootfs_copy("pageout");
    if !compile_c(PAGEOUT_C, &root.join("bin/pageout")) {
        return;
    }
    fs::remove_file(root.join("bin/pageout.c")).unwrap();
    const SIZE: usize = 4 << 20;
    let data: Vec<u8> = (0..SIZE).map(|i| (i % 251) as u8 + 1).collect();
    let big = write_file(&root.join("data/big"), &data);
    fs::set_permissions(big, fs::Permissions::from_mode(0o644)).unwrap();
    fx.import("shared", &root);
    fx.sh("shared", &[], "true");
    let layer = fx.layers("shared").remove(0);
    let host_view = fx.mount_point(&layer).join("data/big");
    assert_eq!(fs::read(&host_view).unwrap(), data);
    assert_eq!(
        cached_bytes(&host_view),
        SIZE as u64,
        "the host read it all"
    );

    let result = fx.run_json(&["--image", "shared"], &["/bin/pageout", "/data/big"]);
    assert_eq!(result["stdout"], "pageout 0\ncold 0\n", "{result}");
    assert_eq!(result["exit_code"], 0, "{result}");
    // What brig reports: the advice is ignored, not refused.
    let ignored = &result["enforced"]["seccomp"]["filter"]["ignored_advice"];
    assert!(
        ignored
            .as_array()
            .is_some_and(|a| a.contains(&json!("madvise(MADV_PAGEOUT)"))),
        "{result}"
    );
    assert_eq!(
        cached_bytes(&host_view),
        SIZE as u64,
        "the sandbox evicted a shared layer's file from the page cache"
    );
    // The same advice from an owner outside any sandbox does evict: the pages could
    // have gone.
    let out = Command::new(root.join("bin/pageout"))
        .arg(&host_view)
        .output()
        .unwrap();
    assert_eq!(ok(&out, "pageout on the host"), "pageout 0\ncold 0\n");
    let left = cached_bytes(&host_view);
    assert!(
        left < SIZE as u64 / 2,
        "the host's pageout left {left} bytes"
    );
}

/// An image is untrusted: its layers, mounted on the host, honour neither setuid
/// bits nor device nodes.
fn assert_layer_mount_options(mount: &HostMount) {
    let options: Vec<&str> = mount.options.split(',').collect();
    for option in ["ro", "nosuid", "nodev"] {
        assert!(options.contains(&option), "{option}: {}", mount.options);
    }
}

#[test]
fn root_layers_mounted_on_the_host_honour_no_setuid_bits_or_devices() {
    require_root!();
    let fx = Fixture::new();
    fx.import_rootfs("base");
    fx.sh("base", &[], "true");
    let layer = fx.layers("base").remove(0);
    let mount = host_mounts()
        .into_iter()
        .find(|m| m.point == fx.mount_point(&layer))
        .expect("the layer stays mounted after the run");
    assert_layer_mount_options(&mount);
}

// 8. Loop-device fallback -----------------------------------------------------------

#[test]
fn root_loop_fallback_mounts_through_an_autoclear_loop_device_released_by_gc() {
    require_root!();
    let fx = Fixture::new();
    fx.import_rootfs("base");
    let layer = fx.layers("base").remove(0);
    let out = fx
        .run_cmd(&["--image", "base"], &["/bin/cat", "/data/greeting"])
        .env("BRIG_LAYER_MOUNT", "loop")
        .output()
        .unwrap();
    assert_eq!(ok(&out, "run over a loop device"), "hello from the image\n");
    let mount = host_mounts()
        .into_iter()
        .find(|m| m.point == fx.mount_point(&layer))
        .expect("the layer stays mounted after the run");
    assert_eq!(mount.fstype, "erofs");
    assert_layer_mount_options(&mount);
    assert!(mount.source.starts_with("/dev/loop"), "{}", mount.source);
    let devices = fx.loop_devices();
    assert_eq!(devices.len(), 1, "{devices:?}");
    let (device, backing) = &devices[0];
    assert_eq!(Path::new(backing), fx.layer_file(&layer));
    assert_eq!(mount.source, format!("/dev/{device}"));
    let autoclear = fs::read_to_string(format!("/sys/block/{device}/loop/autoclear")).unwrap();
    assert_eq!(
        autoclear.trim(),
        "1",
        "the device must clear itself at unmount"
    );
    // A second run uses the same mount and device.
    let out = fx
        .run_cmd(&["--image", "base"], &["/bin/true"])
        .env("BRIG_LAYER_MOUNT", "loop")
        .output()
        .unwrap();
    ok(&out, "second run");
    assert_eq!(fx.loop_devices().len(), 1);

    let gc = fx.gc(true);
    assert_eq!(gc["unmounted"], json!([layer]), "{gc}");
    assert_eq!(fx.mounts().len(), 0);
    assert!(
        eventually(60_000, || fx.loop_devices().is_empty()),
        "loop devices still refer to the store: {:?}",
        fx.loop_devices()
    );
    // Unreferenced, the layer can then go.
    ok(&fx.image(&["rm", "base"]), "rm");
    assert_eq!(fx.gc(false)["removed_layers"], json!([layer]));
}

// 9. No leaks -----------------------------------------------------------------------

#[test]
fn root_runs_leave_only_layer_mounts_and_gc_unmount_leaves_none() {
    require_root!();
    let fx = Fixture::new();
    fx.import_rootfs("base");
    let ws_dir = fx.shared_dir("ws");
    let ws = ws_dir.to_str().unwrap();
    // A normal run, a failing command, a timeout, a snapshot, a refused snapshot,
    // an unknown command, a diff and an inspect.
    fx.sh("base", &[], "cat /data/greeting");
    let out = fx.run(&["--image", "base"], &["/bin/sh", "-c", "exit 3"]);
    assert_eq!(out.status.code(), Some(3));
    let out = fx.run(
        &["--image", "base", "--timeout", "500ms"],
        &["/bin/sleep", "600"],
    );
    assert_eq!(out.status.code(), Some(124));
    fx.sh(
        "base",
        &["--snapshot-to", "snap", "--workspace", ws],
        "echo s > /data/s",
    );
    let out = fx.run(&["--image", "base", "--snapshot-to", "snap"], &["true"]);
    refused(&out, "snapshot to an existing name");
    let out = fx.run(&["--image", "snap"], &["/no/such/command"]);
    assert_eq!(out.status.code(), Some(127));
    ok(&fx.image(&["diff", "base", "snap"]), "diff");
    fx.inspect("snap");

    let layer_mounts: BTreeSet<PathBuf> = fx
        .layers("snap")
        .iter()
        .map(|l| fx.mount_point(l))
        .collect();
    let mounts = fx.mounts();
    assert_eq!(
        mounts.len(),
        layer_mounts.len(),
        "one mount per layer, nothing else: {mounts:?}"
    );
    assert_eq!(mounts.into_iter().collect::<BTreeSet<_>>(), layer_mounts);
    // No overlay or tmpfs of a sandbox leaked into the host's mount namespace.
    let leaked: Vec<String> = host_mounts()
        .iter()
        .filter(|m| {
            m.point.starts_with(fx.dir.path()) && !layer_mounts.contains(&m.point)
                || m.source.contains(fx.store.to_str().unwrap()) && m.fstype != "erofs"
        })
        .map(|m| format!("{} {} {}", m.point.display(), m.fstype, m.source))
        .collect();
    assert!(leaked.is_empty(), "{leaked:?}");
    assert_eq!(fx.tmp_debris(), Vec::<String>::new());

    let gc = fx.gc(true);
    assert_eq!(gc["unmounted"].as_array().unwrap().len(), 2, "{gc}");
    assert_eq!(fx.mounts(), Vec::<PathBuf>::new(), "after gc --unmount");
    assert_eq!(fx.loop_devices(), Vec::<(String, String)>::new());
    // Layers come back on demand.
    assert_eq!(fx.sh("snap", &[], "cat /data/s"), "s\n");
}

#[test]
fn root_store_tmp_is_empty_after_every_verb() {
    require_root!();
    let fx = Fixture::new();
    fx.import_rootfs("base");
    fx.sh("base", &["--snapshot-to", "snap"], "echo s > /data/s");
    ok(&fx.image(&["diff", "base", "snap"]), "diff");
    let bad = write_file(&fx.path("bad.tar"), b"not a tar archive at all");
    refused(
        &fx.image(&["import", "bad", bad.to_str().unwrap()]),
        "bad tar",
    );
    assert_eq!(fx.tmp_entries(), Vec::<String>::new());
}

// 10. Isolation with an image root --------------------------------------------------

#[test]
fn root_image_root_hides_the_host_and_is_reported_as_image() {
    require_root!();
    let fx = Fixture::new();
    fx.import_rootfs("base");
    let secret = fx.path("host-secret");
    fs::write(&secret, "host secret\n").unwrap();
    fs::set_permissions(&secret, fs::Permissions::from_mode(0o644)).unwrap();
    let result = fx.run_json(
        &["--image", "base"],
        &[
            "/bin/sh",
            "-c",
            &format!(
                "cat /etc/shadow 2>/dev/null && echo SHADOW; ls /root 2>/dev/null && echo ROOT; \
                 ls /usr 2>/dev/null && echo USR; cat {} 2>/dev/null && echo SECRET; \
                 ls {} 2>/dev/null && echo STORE; ls /home 2>/dev/null && echo HOME; \
                 ls -A /; echo done",
                secret.display(),
                fx.store.display()
            ),
        ],
    );
    let stdout = result["stdout"].as_str().unwrap();
    for leak in ["SHADOW", "ROOT", "USR", "SECRET", "STORE", "HOME", "root:"] {
        assert!(!stdout.contains(leak), "{leak} visible: {stdout}");
    }
    assert!(stdout.ends_with("done\n"), "{result}");
    let root = result["enforced"]["filesystem"]["root"].as_str().unwrap();
    assert!(
        root.starts_with("image"),
        "enforced.filesystem.root: {root}"
    );
    // The image's own top level, plus what brig mounts, and nothing from the host.
    let top: BTreeSet<&str> = stdout.lines().filter(|l| *l != "done").collect();
    let allowed: BTreeSet<&str> = [
        "bin",
        "lib",
        "lib64",
        "data",
        "etc",
        "dev",
        "proc",
        "sys",
        "tmp",
        "workspace",
    ]
    .into_iter()
    .collect();
    assert!(top.is_subset(&allowed), "top level: {top:?}");
}

#[test]
fn root_writes_over_the_read_only_lower_never_reach_the_layer_file() {
    require_root!();
    let fx = Fixture::new();
    fx.import_rootfs("base");
    fx.sh("base", &[], "true");
    let layer = fx.layers("base").remove(0);
    let file = fx.layer_file(&layer);
    let before = file_sha256(&file);
    let recorded = fx.inspect("base")["layers"][0]["file_sha256"].clone();
    assert_eq!(json!(before), recorded);
    // Every file of the image appended to, some removed, renamed, and a directory
    // replaced; as root of the sandbox and as another user.
    // (Not /bin/sh: it runs the script, and a running file cannot be written.)
    let script = "for f in /bin/* /lib/*/* /lib64/* /data/*; do [ $f = /bin/sh ] && continue; \
                  echo junk >> $f || echo FAIL $f; done; \
                  rm /data/greeting; mv /bin/ls /bin/ls2; rm -r /data; echo replaced > /data; \
                  echo modified";
    for user in ["0", "1000"] {
        let out = fx.sh("base", &["--user", user], script);
        assert!(!out.contains("FAIL"), "as {user}: {out}");
        assert!(out.ends_with("modified\n"), "as {user}: {out}");
        assert_eq!(
            file_sha256(&file),
            before,
            "as {user}: the layer file changed"
        );
        let host_view = fx.mount_point(&layer).join("data/greeting");
        assert_eq!(
            fs::read_to_string(host_view).unwrap(),
            "hello from the image\n"
        );
    }
    // A new sandbox sees the image as it was.
    assert_eq!(
        fx.sh(
            "base",
            &[],
            "cat /data/greeting; ls /bin/ls2 2>/dev/null; ls -d /data/"
        ),
        "hello from the image\n/data/\n"
    );
    // Unmounted and mounted again, the file still checks out.
    fx.gc(true);
    assert_eq!(
        fx.sh("base", &[], "cat /data/greeting"),
        "hello from the image\n"
    );
    assert_eq!(file_sha256(&file), before);
}

#[test]
fn root_error_for_a_name_with_a_newline_stays_one_line() {
    require_root!();
    let fx = Fixture::new();
    let source = fx.rootfs();
    refused_without_change(&fx, "import of a name with a newline", || {
        fx.image(&["import", "new\nline", source.to_str().unwrap()])
    });
}

/// A snapshot's layer is addressed by the digest of exactly what it stores: files
/// the sandbox wrote as its host id are stored as the image's root, and the digest
/// says so (it once covered the host id, so an import of the stored tree got
/// another digest, and a tree owned by that id got this layer back as root's).
#[test]
fn root_a_snapshot_layers_digest_is_the_digest_of_what_it_stores() {
    require_root!();
    let fx = Fixture::new();
    fx.import_rootfs("base");
    fx.sh(
        "base",
        &["--snapshot-to", "owned"],
        "echo mine > /data/mine; mkdir /data/mydir; ln -s mine /data/link",
    );
    // Running it mounts its layers where the store shares them.
    fx.sh("owned", &[], "true");
    let top = fx.layers("owned").pop().unwrap();
    let stored = brig_image::tree::digest(&fx.mount_point(&top), &brig_image::Silent).unwrap();
    assert_eq!(stored, top, "the layer's digest is not that of its content");
}

/// A sparse file takes no disk but is read whole by packing: one far larger than
/// the sandbox's disk is refused at once, not packed for minutes after --timeout.
#[test]
fn root_a_huge_sparse_file_cannot_make_snapshot_to_pack_without_bound() {
    require_root!();
    let fx = Fixture::new();
    let tree = fx.rootfs_copy("with-truncate");
    fs::copy("/usr/bin/truncate", tree.join("bin/truncate")).unwrap();
    fx.import("base", &tree);
    // Packing 1 EiB would never end: brig is given ten minutes, far more than
    // the refusal takes (the copy's first file), and killed past them.
    let mut run = Background::spawn(fx.run_cmd(
        &[
            "--image",
            "base",
            "--disk",
            "32M",
            "--snapshot-to",
            "sparse",
        ],
        &["/bin/truncate", "-s", "1E", "/data/holes"],
    ));
    assert!(
        eventually(600_000, || run.exited()),
        "brig was still packing a sparse exabyte after ten minutes"
    );
    let line = refused(&run.wait(), "snapshot of a 1 EiB sparse file");
    assert!(line.contains("apparent sizes"), "{line}");
    assert!(!fx.image_names().contains(&"sparse".to_string()));
    assert_eq!(fx.tmp_debris(), Vec::<String>::new());
}

/// Sends a read-write descriptor of the file `argv[2]` (created if need be) over the
/// unix socket `argv[1]`.
const SENDFD_C: &str = r#"
#include <fcntl.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
int main(int argc, char **argv) {
    int fd = open(argv[2], O_RDWR | O_CREAT, 0644);
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    strncpy(addr.sun_path, argv[1], sizeof addr.sun_path - 1);
    if (fd < 0 || s < 0 || connect(s, (struct sockaddr *)&addr, sizeof addr) != 0) return 1;
    char byte = 0, control[CMSG_SPACE(sizeof fd)];
    struct iovec iov = {.iov_base = &byte, .iov_len = 1};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control,
                         .msg_controllen = sizeof control};
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof fd);
    memcpy(CMSG_DATA(c), &fd, sizeof fd);
    return sendmsg(s, &msg, 0) == 1 ? 0 : 1;
}
"#;

/// Takes a descriptor of a file in another sandbox's writes and, until told to
/// stop, keeps rewriting it: what a snapshot of that sandbox must not mix up.
/// (Landlock keeps a sandbox from opening anything below a directory descriptor
/// of another's; a file already open is written through.)
const HOLDER_PY: &str = r#"
import os, socket, sys, time
shared = sys.argv[1]
listener = socket.socket(socket.AF_UNIX)
listener.bind(shared + '/sock')
os.chmod(shared + '/sock', 0o777)
listener.listen(1)
open(shared + '/listening', 'w').close()
conn, _ = listener.accept()
_, fds, _, _ = socket.recv_fds(conn, 1, 1)
fd = fds[0]
n = 0
deadline = time.time() + 300
while not os.path.exists(shared + '/stop') and time.time() < deadline:
    n += 1
    os.pwrite(fd, b'rewrite %08d\n' % n * 4096, 0)
    if n == 1:
        open(shared + '/holding', 'w').close()
print(n)
"#;

/// Sandbox A passes a descriptor of a file it wrote to sandbox B, which keeps
/// writing through it while A's snapshot is cut (after A's command has ended).
/// The layer must store one state of the file under the digest of exactly that
/// state: a layer shared by digest must never hand out other bytes.
#[test]
fn root_a_sandbox_holding_anothers_writes_cannot_poison_its_snapshot() {
    require_root!();
    let fx = Fixture::new();
    let tree = fx.rootfs_copy("with-sendfd");
    if !compile_c(SENDFD_C, &tree.join("bin/sendfd")) {
        return;
    }
    fs::copy("/usr/bin/head", tree.join("bin/head")).unwrap();
    fx.import("base", &tree);
    let shared = fx.shared_dir("shared");
    let shared_arg = format!("{}:/shared:rw", shared.display());
    let holder = Background::spawn({
        let mut cmd = fx.run_cmd(
            &["--bind", &shared_arg, "--timeout", "600s"],
            &["python3", "-c", HOLDER_PY, "/shared"],
        );
        cmd.stdout(Stdio::piped());
        cmd
    });
    assert!(
        eventually(60_000, || shared.join("listening").exists()),
        "the holder never listened"
    );
    // A writes enough that its snapshot takes a while, hands a file over, and ends
    // once the holder writes through it.
    fx.sh(
        "base",
        &["--snapshot-to", "snap", "--disk", "48M", "--bind", &shared_arg],
        "head -c 24M /dev/urandom > /data/random && /bin/sendfd /shared/sock /data/poisoned && while [ ! -e /shared/holding ]; do sleep 0.1; done",
    );
    fs::write(shared.join("stop"), "").unwrap();
    let out = holder.wait();
    let rewrites: u64 = ok(&out, "the holder").trim().parse().unwrap();
    assert!(rewrites > 0, "the holder never wrote");
    fx.sh("snap", &[], "true");
    let top = fx.layers("snap").pop().unwrap();
    let stored = brig_image::tree::digest(&fx.mount_point(&top), &brig_image::Silent).unwrap();
    assert_eq!(
        stored, top,
        "the layer stores other bytes than its digest says"
    );
}
