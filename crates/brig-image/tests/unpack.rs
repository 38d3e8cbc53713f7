//! Image sources to staged layers: every source format, the overlayfs layer
//! format, metadata, hostile archives and corrupt input.
//!
//! Extraction sets owners and creates device nodes, so most tests need root;
//! they say so and pass without checking anything otherwise.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use brig_image::unpack::{detect, extract_layer, unpack, SourceKind, StagedLayer, Unpacked};
use brig_image::{ImageConfig, ImageError, Progress, Silent};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tar::{EntryType, Header};
use tempfile::TempDir;

const MTIME: u64 = 1_600_000_000;

macro_rules! require_root {
    () => {
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipping: needs root to set owners and create device nodes");
            return;
        }
    };
}

// ---------------------------------------------------------------- archives

/// Builds tar archives byte by byte where needed: the tar crate's own
/// builder refuses the hostile paths these tests are about.
struct Tar(tar::Builder<Vec<u8>>);

impl Tar {
    fn new() -> Self {
        Tar(tar::Builder::new(Vec::new()))
    }

    fn entry(
        &mut self,
        kind: EntryType,
        path: &str,
        link: &str,
        data: &[u8],
        tweak: impl FnOnce(&mut Header),
    ) -> &mut Self {
        assert!(
            path.len() < 100 && link.len() < 100,
            "test paths must fit the header"
        );
        let mut header = Header::new_gnu();
        header.set_entry_type(kind);
        header.set_size(data.len() as u64);
        header.set_mode(if kind == EntryType::Directory {
            0o755
        } else {
            0o644
        });
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(MTIME);
        let old = header.as_old_mut();
        old.name[..path.len()].copy_from_slice(path.as_bytes());
        old.linkname[..link.len()].copy_from_slice(link.as_bytes());
        tweak(&mut header);
        header.set_cksum();
        self.0.append(&header, data).unwrap();
        self
    }

    fn file(&mut self, path: &str, data: &[u8]) -> &mut Self {
        self.entry(EntryType::Regular, path, "", data, |_| {})
    }

    fn dir(&mut self, path: &str) -> &mut Self {
        self.entry(EntryType::Directory, path, "", b"", |_| {})
    }

    fn symlink(&mut self, path: &str, target: &str) -> &mut Self {
        self.entry(EntryType::Symlink, path, target, b"", |_| {})
    }

    fn hardlink(&mut self, path: &str, target: &str) -> &mut Self {
        self.entry(EntryType::Link, path, target, b"", |_| {})
    }

    /// A pax header for the next entry.
    fn pax(&mut self, records: &[(&str, &[u8])]) -> &mut Self {
        let mut data = Vec::new();
        for (key, value) in records {
            // "<len> <key>=<value>\n", where len counts itself.
            let body = key.len() + value.len() + 3;
            let mut len = body + body.to_string().len();
            if len.to_string().len() != body.to_string().len() {
                len += 1;
            }
            data.extend(format!("{len} {key}=").as_bytes());
            data.extend(*value);
            data.push(b'\n');
        }
        self.entry(EntryType::XHeader, "PaxHeaders/next", "", &data, |_| {})
    }

    fn build(self) -> Vec<u8> {
        self.0.into_inner().unwrap()
    }
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(data).unwrap();
    encoder.finish().unwrap()
}

fn zstd(data: &[u8]) -> Vec<u8> {
    zstd::encode_all(data, 3).unwrap()
}

fn sha256(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

/// The base layer of the test image.
fn base_layer() -> Vec<u8> {
    let mut t = Tar::new();
    t.dir("./")
        .dir("./etc/")
        .file("./etc/os-release", b"brig test\n")
        .file("./etc/removed", b"soon gone\n")
        .dir("./bin/")
        .entry(EntryType::Regular, "./bin/tool", "", b"#!/bin/sh\n", |h| {
            h.set_mode(0o755)
        })
        .dir("./opt/")
        .file("./opt/old", b"hidden by the upper layer\n");
    t.build()
}

/// The upper layer: replaces, deletes, and hides a directory's lower content.
fn upper_layer() -> Vec<u8> {
    let mut t = Tar::new();
    t.dir("etc/")
        .file("etc/os-release", b"brig test v2\n")
        .file("etc/.wh.removed", b"")
        .dir("opt/")
        .file("opt/.wh..wh..opq", b"")
        .file("opt/new", b"only this\n");
    t.build()
}

fn test_config() -> ImageConfig {
    ImageConfig {
        env: vec!["PATH=/usr/bin:/bin".into(), "GREETING=hi".into()],
        user: Some("1000:100".into()),
        workdir: Some("/srv".into()),
        entrypoint: vec!["/bin/tool".into()],
        cmd: vec!["--serve".into()],
    }
}

/// An image config in the OCI/docker format, listing `layers`' diff_ids.
fn config_json(layers: &[&[u8]]) -> Vec<u8> {
    let diff_ids: Vec<String> = layers
        .iter()
        .map(|l| format!("sha256:{}", sha256(l)))
        .collect();
    serde_json::to_vec(&json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Env": ["PATH=/usr/bin:/bin", "GREETING=hi"],
            "User": "1000:100",
            "WorkingDir": "/srv",
            "Entrypoint": ["/bin/tool"],
            "Cmd": ["--serve"],
            "Labels": {"ignored": "yes"}
        },
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "history": []
    }))
    .unwrap()
}

/// Writes an OCI layout of the test image into `dir`; `blobs` are the layers
/// as stored (maybe compressed) with their media types.
fn write_oci_layout(dir: &Path, blobs: &[(Vec<u8>, &str)]) {
    let uncompressed = [base_layer(), upper_layer()];
    let refs: Vec<&[u8]> = uncompressed.iter().map(Vec::as_slice).collect();
    let blob_dir = dir.join("blobs/sha256");
    fs::create_dir_all(&blob_dir).unwrap();
    let put = |data: &[u8], media_type: &str| -> Value {
        let hex = sha256(data);
        fs::write(blob_dir.join(&hex), data).unwrap();
        json!({"mediaType": media_type, "digest": format!("sha256:{hex}"), "size": data.len()})
    };
    let config = put(
        &config_json(&refs),
        "application/vnd.oci.image.config.v1+json",
    );
    let layers: Vec<Value> = blobs.iter().map(|(data, kind)| put(data, kind)).collect();
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": config,
        "layers": layers,
    }))
    .unwrap();
    let mut manifest = put(&manifest, "application/vnd.oci.image.manifest.v1+json");
    manifest["platform"] = json!({"architecture": "amd64", "os": "linux"});
    fs::write(
        dir.join("oci-layout"),
        br#"{"imageLayoutVersion": "1.0.0"}"#,
    )
    .unwrap();
    fs::write(
        dir.join("index.json"),
        serde_json::to_vec(&json!({"schemaVersion": 2, "manifests": [manifest]})).unwrap(),
    )
    .unwrap();
}

/// The test image's layers as an OCI layout: gzip base, zstd upper.
fn oci_layout(dir: &Path) {
    write_oci_layout(
        dir,
        &[
            (
                gzip(&base_layer()),
                "application/vnd.oci.image.layer.v1.tar+gzip",
            ),
            (
                zstd(&upper_layer()),
                "application/vnd.oci.image.layer.v1.tar+zstd",
            ),
        ],
    );
}

/// A tar of the directory `dir`, as `tar -C dir -cf - .` makes.
fn tar_of_dir(dir: &Path) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    builder.append_dir_all(".", dir).unwrap();
    builder.into_inner().unwrap()
}

fn append(builder: &mut tar::Builder<Vec<u8>>, path: &str, data: &[u8]) {
    let mut header = Header::new_gnu();
    header.set_size(data.len() as u64);
    header.set_mode(0o644);
    header.set_mtime(MTIME);
    builder.append_data(&mut header, path, data).unwrap();
}

// ---------------------------------------------------------------- checks

fn read(path: impl AsRef<Path>) -> String {
    fs::read_to_string(path).unwrap()
}

fn lstat(path: impl AsRef<Path>) -> fs::Metadata {
    fs::symlink_metadata(path).unwrap()
}

fn xattr(path: impl AsRef<Path>, name: &str) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; 256];
    match rustix::fs::lgetxattr(path.as_ref(), name, &mut buf[..]) {
        Ok(n) => Some(buf[..n].to_vec()),
        Err(rustix::io::Errno::NODATA) => None,
        Err(e) => panic!("lgetxattr {name}: {e}"),
    }
}

fn assert_whiteout(path: impl AsRef<Path>) {
    let path = path.as_ref();
    let meta = lstat(path);
    assert!(
        meta.file_type().is_char_device(),
        "{} is not a whiteout",
        path.display()
    );
    assert_eq!(meta.rdev(), 0, "{}", path.display());
    assert_eq!(meta.mode() & 0o7777, 0, "{}", path.display());
}

/// Checks the two layers of the test image and its config.
fn assert_test_image(unpacked: &Unpacked, staging: &Path) {
    let layers: Vec<&Path> = unpacked.layers.iter().map(|l| l.path.as_path()).collect();
    assert_eq!(layers, [staging.join("layer-0"), staging.join("layer-1")]);
    assert!(unpacked.layers.iter().all(|l| !l.borrowed));
    let (base, upper) = (layers[0], layers[1]);

    assert_eq!(read(base.join("etc/os-release")), "brig test\n");
    assert_eq!(read(base.join("etc/removed")), "soon gone\n");
    assert_eq!(lstat(base.join("bin/tool")).mode() & 0o7777, 0o755);
    assert_eq!(read(base.join("opt/old")), "hidden by the upper layer\n");

    assert_eq!(read(upper.join("etc/os-release")), "brig test v2\n");
    assert_whiteout(upper.join("etc/removed"));
    assert!(!upper.join("etc/.wh.removed").exists());
    assert_eq!(
        xattr(upper.join("opt"), "user.overlay.opaque").as_deref(),
        Some(&b"y"[..])
    );
    assert!(!upper.join("opt/.wh..wh..opq").exists());
    assert_eq!(read(upper.join("opt/new")), "only this\n");

    assert_eq!(unpacked.config, test_config());
    // Only the layers: temporary files went away with the unpack.
    let mut names: Vec<_> = fs::read_dir(staging)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    assert_eq!(names, ["layer-0", "layer-1"]);
}

fn assert_bad_source(err: ImageError, mentions: &str) {
    match &err {
        ImageError::BadSource(message) => {
            assert!(
                message.contains(mentions),
                "'{message}' should mention '{mentions}'"
            );
            assert!(!message.contains('\n'), "'{message}' should be one line");
        }
        other => panic!("expected BadSource mentioning '{mentions}', got {other:?}"),
    }
}

fn new_staging() -> TempDir {
    tempfile::tempdir().unwrap()
}

// ---------------------------------------------------------------- the outer world

/// A directory standing for the rest of the host: a layer is extracted into
/// `staging/layer` inside it, and nothing else in it may change.
struct World {
    dir: TempDir,
}

impl World {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("etc")).unwrap();
        fs::write(dir.path().join("etc/passwd"), "root:x:0:0::/root:/bin/sh\n").unwrap();
        fs::create_dir_all(dir.path().join("staging/layer")).unwrap();
        World { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn layer(&self) -> PathBuf {
        self.path().join("staging/layer")
    }

    /// Every path outside staging with its type, size, mode and link count.
    fn snapshot(&self) -> BTreeMap<PathBuf, (u32, u64, u64)> {
        fn walk(dir: &Path, skip: &Path, out: &mut BTreeMap<PathBuf, (u32, u64, u64)>) {
            for entry in fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path == skip {
                    continue;
                }
                let meta = lstat(&path);
                out.insert(path.clone(), (meta.mode(), meta.len(), meta.nlink()));
                if meta.is_dir() {
                    walk(&path, skip, out);
                }
            }
        }
        let mut out = BTreeMap::new();
        walk(self.path(), &self.path().join("staging"), &mut out);
        out
    }

    /// Extracts `archive`, expecting `PathEscape`, and checks nothing outside
    /// the layer changed.
    fn assert_escape_refused(&self, archive: &[u8]) {
        let before = self.snapshot();
        let err = extract_layer(archive, &self.layer(), &Silent).unwrap_err();
        assert!(
            matches!(err, ImageError::PathEscape { .. }),
            "expected PathEscape, got {err:?}"
        );
        assert!(!err.to_string().contains('\n'));
        assert_eq!(self.snapshot(), before, "the outer world changed");
        assert_eq!(
            read(self.path().join("etc/passwd")),
            "root:x:0:0::/root:/bin/sh\n"
        );
        assert!(!self.path().join("staging/x").exists());
    }
}

// ---------------------------------------------------------------- source formats

#[test]
fn directory_source_is_used_in_place() {
    let rootfs = tempfile::tempdir().unwrap();
    fs::write(rootfs.path().join("hello"), "hi").unwrap();
    let staging = new_staging();
    assert_eq!(detect(rootfs.path()).unwrap(), SourceKind::Directory);
    let unpacked = unpack(rootfs.path(), staging.path(), &Silent).unwrap();
    assert_eq!(
        unpacked.layers,
        [StagedLayer {
            path: rootfs.path().canonicalize().unwrap(),
            borrowed: true
        }]
    );
    assert_eq!(unpacked.config, ImageConfig::default());
    assert_eq!(fs::read_dir(staging.path()).unwrap().count(), 0);
}

fn unpack_rootfs_archive(bytes: &[u8], name: &str) {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join(name);
    fs::write(&source, bytes).unwrap();
    assert_eq!(detect(&source).unwrap(), SourceKind::Tar);
    let staging = new_staging();
    let unpacked = unpack(&source, staging.path(), &Silent).unwrap();
    assert_eq!(
        unpacked.layers,
        [StagedLayer {
            path: staging.path().join("layer-0"),
            borrowed: false
        }]
    );
    assert_eq!(unpacked.config, ImageConfig::default());
    let layer = &unpacked.layers[0].path;
    assert_eq!(read(layer.join("etc/os-release")), "brig test\n");
    assert_eq!(lstat(layer.join("bin/tool")).mode() & 0o7777, 0o755);
}

#[test]
fn plain_tar_source() {
    require_root!();
    unpack_rootfs_archive(&base_layer(), "rootfs.tar");
}

#[test]
fn gzip_tar_source_is_recognised_by_content() {
    require_root!();
    // The name says nothing (or lies): the magic bytes decide.
    unpack_rootfs_archive(&gzip(&base_layer()), "rootfs.tar");
    unpack_rootfs_archive(&gzip(&base_layer()), "rootfs");
}

#[test]
fn zstd_tar_source_is_recognised_by_content() {
    require_root!();
    unpack_rootfs_archive(&zstd(&base_layer()), "rootfs.tar.gz");
}

#[test]
fn oci_layout_directory() {
    require_root!();
    let layout = tempfile::tempdir().unwrap();
    oci_layout(layout.path());
    assert_eq!(detect(layout.path()).unwrap(), SourceKind::OciLayout);
    let staging = new_staging();
    let unpacked = unpack(layout.path(), staging.path(), &Silent).unwrap();
    assert_test_image(&unpacked, staging.path());
}

#[test]
fn oci_layout_with_plain_and_docker_media_types() {
    require_root!();
    let layout = tempfile::tempdir().unwrap();
    write_oci_layout(
        layout.path(),
        &[
            (base_layer(), "application/vnd.oci.image.layer.v1.tar"),
            (
                gzip(&upper_layer()),
                "application/vnd.docker.image.rootfs.diff.tar.gzip",
            ),
        ],
    );
    let staging = new_staging();
    let unpacked = unpack(layout.path(), staging.path(), &Silent).unwrap();
    assert_test_image(&unpacked, staging.path());
}

#[test]
fn oci_layout_as_tar() {
    require_root!();
    let layout = tempfile::tempdir().unwrap();
    oci_layout(layout.path());
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("image.tar");
    fs::write(&source, tar_of_dir(layout.path())).unwrap();
    assert_eq!(detect(&source).unwrap(), SourceKind::OciLayout);
    let staging = new_staging();
    let unpacked = unpack(&source, staging.path(), &Silent).unwrap();
    assert_test_image(&unpacked, staging.path());
}

#[test]
fn oci_layout_as_compressed_tar() {
    require_root!();
    let layout = tempfile::tempdir().unwrap();
    oci_layout(layout.path());
    let dir = tempfile::tempdir().unwrap();
    for (name, bytes) in [
        ("image.tar.gz", gzip(&tar_of_dir(layout.path()))),
        ("image.tar.zst", zstd(&tar_of_dir(layout.path()))),
    ] {
        let source = dir.path().join(name);
        fs::write(&source, bytes).unwrap();
        assert_eq!(detect(&source).unwrap(), SourceKind::OciLayout, "{name}");
        let staging = new_staging();
        let unpacked = unpack(&source, staging.path(), &Silent).unwrap();
        assert_test_image(&unpacked, staging.path());
    }
}

/// The OCI platform name of this machine's architecture.
fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

#[test]
fn oci_nested_index_picks_this_machines_platform() {
    require_root!();
    let layout = tempfile::tempdir().unwrap();
    oci_layout(layout.path());
    // Move the image's manifest into a nested index next to a decoy for
    // another platform (whose blobs do not exist: choosing it would fail).
    let index: Value =
        serde_json::from_slice(&fs::read(layout.path().join("index.json")).unwrap()).unwrap();
    let mut real = index["manifests"][0].clone();
    real["platform"] = json!({"architecture": host_arch(), "os": "linux"});
    let decoy = json!({
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "digest": format!("sha256:{}", "0".repeat(64)),
        "size": 1,
        "platform": {"architecture": "not-this-one", "os": "linux"},
    });
    let attestation = json!({
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "digest": format!("sha256:{}", "1".repeat(64)),
        "size": 1,
        "platform": {"architecture": "unknown", "os": "unknown"},
        "annotations": {"vnd.docker.reference.type": "attestation-manifest"},
    });
    let nested = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [decoy, real, attestation],
    }))
    .unwrap();
    let hex = sha256(&nested);
    fs::write(layout.path().join("blobs/sha256").join(&hex), &nested).unwrap();
    fs::write(
        layout.path().join("index.json"),
        serde_json::to_vec(&json!({"schemaVersion": 2, "manifests": [{
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "digest": format!("sha256:{hex}"),
            "size": nested.len(),
        }]}))
        .unwrap(),
    )
    .unwrap();
    let staging = new_staging();
    let unpacked = unpack(layout.path(), staging.path(), &Silent).unwrap();
    assert_test_image(&unpacked, staging.path());
}

/// A docker-save archive of three layers: legacy `<id>/layer.tar` (plain and
/// gzip-compressed), and a docker 25+ blob reached through a legacy symlink.
fn docker_archive(extra: impl FnOnce(&mut tar::Builder<Vec<u8>>)) -> Vec<u8> {
    let third = {
        let mut t = Tar::new();
        t.file("srv/data", b"third layer\n");
        t.build()
    };
    let layers = [base_layer(), upper_layer(), third.clone()];
    let refs: Vec<&[u8]> = layers.iter().map(Vec::as_slice).collect();
    let config = config_json(&refs);
    let config_name = format!("{}.json", sha256(&config));
    let third_blob = format!("blobs/sha256/{}", sha256(&third));

    let mut b = tar::Builder::new(Vec::new());
    append(
        &mut b,
        &format!("{}/layer.tar", "a".repeat(64)),
        &base_layer(),
    );
    append(
        &mut b,
        &format!("{}/layer.tar", "b".repeat(64)),
        &gzip(&upper_layer()),
    );
    append(&mut b, &third_blob, &third);
    let mut link = Header::new_gnu();
    link.set_entry_type(EntryType::Symlink);
    link.set_size(0);
    b.append_link(
        &mut link,
        format!("{}/layer.tar", "c".repeat(64)),
        format!("../{third_blob}"),
    )
    .unwrap();
    append(&mut b, &config_name, &config);
    extra(&mut b);
    let manifest = json!([
        {
            "Config": config_name,
            "RepoTags": ["brig/test:latest"],
            "Layers": [
                format!("{}/layer.tar", "a".repeat(64)),
                format!("{}/layer.tar", "b".repeat(64)),
                format!("{}/layer.tar", "c".repeat(64)),
            ],
        },
        {"Config": "missing.json", "RepoTags": ["other:latest"], "Layers": ["missing/layer.tar"]},
    ]);
    append(
        &mut b,
        "manifest.json",
        &serde_json::to_vec(&manifest).unwrap(),
    );
    append(&mut b, "repositories", b"{}");
    b.into_inner().unwrap()
}

fn assert_docker_image(unpacked: &Unpacked, staging: &Path) {
    assert_eq!(unpacked.layers.len(), 3);
    assert_eq!(unpacked.layers[2].path, staging.join("layer-2"));
    assert_eq!(read(staging.join("layer-2/srv/data")), "third layer\n");
    // The first two are the test image's.
    let first_two = Unpacked {
        layers: unpacked.layers[..2].to_vec(),
        config: unpacked.config.clone(),
    };
    fs::remove_dir_all(staging.join("layer-2")).unwrap();
    assert_test_image(&first_two, staging);
}

#[test]
fn docker_save_archive() {
    require_root!();
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("saved.tar");
    fs::write(&source, docker_archive(|_| {})).unwrap();
    assert_eq!(detect(&source).unwrap(), SourceKind::DockerArchive);
    let staging = new_staging();
    let unpacked = unpack(&source, staging.path(), &Silent).unwrap();
    assert_docker_image(&unpacked, staging.path());
}

#[test]
fn docker_save_archive_compressed() {
    require_root!();
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("saved.tar.gz");
    fs::write(&source, gzip(&docker_archive(|_| {}))).unwrap();
    assert_eq!(detect(&source).unwrap(), SourceKind::DockerArchive);
    let staging = new_staging();
    let unpacked = unpack(&source, staging.path(), &Silent).unwrap();
    assert_docker_image(&unpacked, staging.path());
}

#[test]
fn docker_25_save_with_an_oci_index_is_read_by_its_manifest_json() {
    require_root!();
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("saved.tar");
    // Were index.json read, its garbage would fail the unpack.
    let archive = docker_archive(|b| {
        append(b, "oci-layout", br#"{"imageLayoutVersion": "1.0.0"}"#);
        append(b, "index.json", b"{ not json");
    });
    fs::write(&source, archive).unwrap();
    assert_eq!(detect(&source).unwrap(), SourceKind::DockerArchive);
    let staging = new_staging();
    let unpacked = unpack(&source, staging.path(), &Silent).unwrap();
    assert_docker_image(&unpacked, staging.path());
}

#[test]
fn a_tar_with_only_an_index_is_a_rootfs() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("rootfs.tar");
    let mut t = Tar::new();
    t.file("index.json", b"{}").file("etc/hostname", b"x");
    fs::write(&source, t.build()).unwrap();
    assert_eq!(detect(&source).unwrap(), SourceKind::Tar);
}

// ---------------------------------------------------------------- layer format

#[test]
fn whiteouts_become_overlay_whiteouts() {
    require_root!();
    let out = tempfile::tempdir().unwrap();
    let mut t = Tar::new();
    t.file(".wh.top", b"")
        .dir("w/")
        .file("w/file", b"extracted, then deleted in the same layer")
        .file("w/.wh.file", b"")
        .dir("w/sub/")
        .file("w/sub/inner", b"")
        .file("w/.wh.sub", b"")
        .file("implicit/.wh.gone", b"")
        .file("w/.wh..wh.plnk", b"");
    extract_layer(&t.build()[..], out.path(), &Silent).unwrap();
    assert_whiteout(out.path().join("top"));
    assert_whiteout(out.path().join("w/file"));
    assert_whiteout(out.path().join("w/sub"));
    assert_whiteout(out.path().join("implicit/gone"));
    // Unlisted directories, the root included, are the same on every import.
    for dir in [out.path().to_path_buf(), out.path().join("implicit")] {
        let meta = lstat(&dir);
        assert_eq!(
            (meta.mode() & 0o7777, meta.uid(), meta.mtime()),
            (0o755, 0, 0),
            "{dir:?}"
        );
    }
    let mut names: Vec<_> = fs::read_dir(out.path().join("w"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["file", "sub"], "no .wh. files are created");
}

#[test]
fn opaque_markers_become_an_xattr() {
    require_root!();
    let out = tempfile::tempdir().unwrap();
    let mut t = Tar::new();
    t.dir("d/")
        .file("d/.wh..wh..opq", b"")
        .file("d/keep", b"this layer's own content stays")
        // The marker may come before its directory is listed, or without it.
        .file("late/.wh..wh..opq", b"")
        .entry(EntryType::Directory, "late/", "", b"", |h| {
            h.set_mode(0o700)
        })
        .file("never/listed/.wh..wh..opq", b"");
    extract_layer(&t.build()[..], out.path(), &Silent).unwrap();
    for dir in ["d", "late", "never/listed"] {
        let path = out.path().join(dir);
        assert_eq!(
            xattr(&path, "user.overlay.opaque").as_deref(),
            Some(&b"y"[..]),
            "{dir}"
        );
        assert!(!path.join(".wh..wh..opq").exists(), "{dir}");
    }
    assert_eq!(
        read(out.path().join("d/keep")),
        "this layer's own content stays"
    );
    assert_eq!(lstat(out.path().join("late")).mode() & 0o7777, 0o700);
    assert_eq!(xattr(out.path().join("never"), "user.overlay.opaque"), None);
}

/// A version 2 file capability granting cap_net_raw, as setcap writes it.
fn net_raw_capability() -> Vec<u8> {
    let mut cap = Vec::new();
    cap.extend(0x0200_0001u32.to_le_bytes()); // revision 2, effective
    cap.extend((1u32 << 13).to_le_bytes()); // permitted: cap_net_raw
    cap.extend([0u8; 12]);
    cap
}

#[test]
fn metadata_is_preserved() {
    require_root!();
    let out = tempfile::tempdir().unwrap();
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let capability = net_raw_capability();
    let mut t = Tar::new();
    t.entry(EntryType::Directory, "./", "", b"", |h| {
        h.set_mode(0o755);
        h.set_mtime(MTIME + 1);
    })
    .entry(EntryType::Directory, "home/", "", b"", |h| {
        h.set_mtime(MTIME + 2)
    })
    .entry(EntryType::Directory, "home/u/", "", b"", |h| {
        h.set_mode(0o700);
        h.set_uid(1234);
        h.set_gid(5678);
        h.set_mtime(MTIME + 3);
    })
    .entry(EntryType::Regular, "home/u/data", "", &big, |h| {
        h.set_mode(0o640);
        h.set_uid(1234);
        h.set_gid(5678);
    })
    .entry(EntryType::Directory, "tmp/", "", b"", |h| {
        h.set_mode(0o1777)
    })
    .entry(EntryType::Regular, "bin/su", "", b"su", |h| {
        h.set_mode(0o4755);
        h.set_gid(42);
    })
    .entry(EntryType::Regular, "bin/wall", "", b"wall", |h| {
        h.set_mode(0o2755);
        h.set_gid(5);
    })
    .hardlink("bin/su-again", "bin/su")
    .pax(&[
        ("SCHILY.xattr.trusted.link", b"on the link itself"),
        (
            "SCHILY.xattr.user.refused",
            b"the kernel refuses user xattrs on symlinks",
        ),
    ])
    .entry(EntryType::Symlink, "bin/sh", "busybox", b"", |h| {
        h.set_uid(7);
        h.set_gid(8);
        h.set_mtime(MTIME + 4);
    })
    .pax(&[
        ("SCHILY.xattr.user.brig", b"hello"),
        ("SCHILY.xattr.trusted.brig", b"trusted"),
        ("SCHILY.xattr.security.ima", b"a hash"),
        ("SCHILY.xattr.security.capability", &capability),
        ("SCHILY.xattr.user.overlay.redirect", b"/elsewhere"),
        ("mtime", b"1600000005.25"),
        ("uid", b"3000000"),
    ])
    .entry(EntryType::Regular, "bin/ping", "", b"ping", |h| {
        h.set_mode(0o755)
    })
    .entry(EntryType::Fifo, "run/fifo", "", b"", |h| h.set_mode(0o600))
    .entry(EntryType::Char, "dev/null", "", b"", |h| {
        h.set_mode(0o666);
        h.set_device_major(1).unwrap();
        h.set_device_minor(3).unwrap();
    })
    .entry(EntryType::Block, "dev/loop0", "", b"", |h| {
        h.set_mode(0o660);
        h.set_gid(6);
        h.set_device_major(7).unwrap();
        h.set_device_minor(0).unwrap();
    });
    extract_layer(&t.build()[..], out.path(), &Silent).unwrap();
    let root = out.path();
    let meta = |p: &str| lstat(root.join(p));

    assert_eq!(fs::read(root.join("home/u/data")).unwrap(), big);
    let data = meta("home/u/data");
    assert_eq!(
        (data.mode() & 0o7777, data.uid(), data.gid()),
        (0o640, 1234, 5678)
    );
    assert_eq!(data.mtime(), MTIME as i64);
    // Directory times survive the creation of their contents.
    let home_u = meta("home/u");
    assert_eq!(
        (home_u.mode() & 0o7777, home_u.uid(), home_u.gid()),
        (0o700, 1234, 5678)
    );
    assert_eq!(home_u.mtime(), MTIME as i64 + 3);
    assert_eq!(meta("home").mtime(), MTIME as i64 + 2);
    assert_eq!(meta("").mtime(), MTIME as i64 + 1);
    assert_eq!(meta("tmp").mode() & 0o7777, 0o1777);
    // Set-id bits survive chown.
    assert_eq!(
        (meta("bin/su").mode() & 0o7777, meta("bin/su").gid()),
        (0o4755, 42)
    );
    assert_eq!(
        (meta("bin/wall").mode() & 0o7777, meta("bin/wall").gid()),
        (0o2755, 5)
    );
    // Implicit parents.
    assert_eq!(meta("bin").mode() & 0o7777, 0o755);

    assert_eq!(meta("bin/su-again").ino(), meta("bin/su").ino());
    assert_eq!(meta("bin/su").nlink(), 2);

    let sh = meta("bin/sh");
    assert!(sh.file_type().is_symlink());
    assert_eq!(
        fs::read_link(root.join("bin/sh")).unwrap(),
        Path::new("busybox")
    );
    assert_eq!((sh.uid(), sh.gid(), sh.mtime()), (7, 8, MTIME as i64 + 4));
    let sh = root.join("bin/sh");
    assert_eq!(xattr(&sh, "user.refused"), None);

    let ping = root.join("bin/ping");
    assert_eq!(xattr(&ping, "user.brig").as_deref(), Some(&b"hello"[..]));
    // Layers are shared by digest, which covers only content xattrs: others in an
    // archive (trusted.*, security.* but capabilities) are dropped, so the first
    // archive of a tree cannot decide what later ones of the same content get.
    assert_eq!(xattr(&sh, "trusted.link"), None);
    assert_eq!(xattr(&ping, "trusted.brig"), None);
    assert_eq!(xattr(&ping, "security.ima"), None);
    // Survives the chown that would otherwise clear it.
    assert_eq!(xattr(&ping, "security.capability"), Some(capability));
    assert_eq!(
        xattr(&ping, "user.overlay.redirect"),
        None,
        "archived overlay xattrs are dropped"
    );
    let ping = meta("bin/ping");
    assert_eq!(
        (ping.mtime(), ping.mtime_nsec()),
        (MTIME as i64 + 5, 250_000_000)
    );
    assert_eq!(ping.uid(), 3_000_000);

    assert!(meta("run/fifo").file_type().is_fifo());
    assert_eq!(meta("run/fifo").mode() & 0o7777, 0o600);
    let null = meta("dev/null");
    assert!(null.file_type().is_char_device());
    assert_eq!(
        (null.rdev(), null.mode() & 0o7777),
        (rustix::fs::makedev(1, 3), 0o666)
    );
    let loop0 = meta("dev/loop0");
    assert!(loop0.file_type().is_block_device());
    assert_eq!((loop0.rdev(), loop0.gid()), (rustix::fs::makedev(7, 0), 6));
}

#[test]
fn later_entries_replace_earlier_ones() {
    require_root!();
    let world = World::new();
    let passwd = world.path().join("etc/passwd");
    let passwd = passwd.to_str().unwrap();
    let mut t = Tar::new();
    t.file("a", b"one")
        .file("a", b"two")
        .dir("d/")
        .file("d/x", b"")
        .file("d", b"a file now")
        .file("e", b"")
        .dir("e/")
        .file("e/y", b"")
        .dir("k/")
        .file("k/keep", b"kept")
        .entry(EntryType::Directory, "k/", "", b"", |h| h.set_mode(0o700))
        // Replacing a symlink replaces the link, never what it points to.
        .symlink("s", passwd)
        .file("s", b"mine")
        .symlink("t", passwd)
        .dir("t/")
        .hardlink("h", "a")
        .file("h", b"not a");
    extract_layer(&t.build()[..], &world.layer(), &Silent).unwrap();
    let layer = world.layer();
    assert_eq!(read(layer.join("a")), "two");
    assert_eq!(read(layer.join("d")), "a file now");
    assert!(lstat(layer.join("e")).is_dir());
    assert!(layer.join("e/y").exists());
    assert_eq!(read(layer.join("k/keep")), "kept");
    assert_eq!(lstat(layer.join("k")).mode() & 0o7777, 0o700);
    assert_eq!(read(layer.join("s")), "mine");
    assert!(lstat(layer.join("t")).is_dir());
    assert_eq!(read(layer.join("h")), "not a");
    assert_eq!(read(layer.join("a")), "two");
    assert_eq!(
        read(world.path().join("etc/passwd")),
        "root:x:0:0::/root:/bin/sh\n"
    );
}

#[test]
fn symlinks_may_point_anywhere() {
    require_root!();
    let out = tempfile::tempdir().unwrap();
    let mut t = Tar::new();
    t.symlink("abs", "/etc/passwd")
        .symlink("up", "../../..")
        .symlink("dangling", "nowhere");
    extract_layer(&t.build()[..], out.path(), &Silent).unwrap();
    for (name, target) in [
        ("abs", "/etc/passwd"),
        ("up", "../../.."),
        ("dangling", "nowhere"),
    ] {
        assert_eq!(
            fs::read_link(out.path().join(name)).unwrap(),
            Path::new(target)
        );
    }
}

#[test]
fn files_ending_in_zeros_keep_their_size_and_content() {
    let out = tempfile::tempdir().unwrap();
    let mut tail = b"data".to_vec();
    tail.extend(vec![0u8; 3 * 4096 + 5]);
    let zeros = vec![0u8; 2 * 4096];
    let mut t = Tar::new();
    t.file("tail", &tail)
        .file("zeros", &zeros)
        .file("empty", b"");
    extract_layer(&t.build()[..], out.path(), &Silent).unwrap();
    assert_eq!(fs::read(out.path().join("tail")).unwrap(), tail);
    assert_eq!(fs::read(out.path().join("zeros")).unwrap(), zeros);
    assert_eq!(fs::read(out.path().join("empty")).unwrap(), b"");
}

#[test]
fn pax_sparse_files_are_refused_rather_than_extracted_wrong() {
    // GNU tar --sparse --format=pax (versions 0.0, 0.1 and 1.0): the tar crate
    // would give the map and the pieces as the file's content.
    for keys in [
        &[
            ("GNU.sparse.size", &b"1048576"[..]),
            ("GNU.sparse.numblocks", b"1"),
        ][..],
        &[
            ("GNU.sparse.major", b"1"),
            ("GNU.sparse.minor", b"0"),
            ("GNU.sparse.name", b"big"),
        ],
    ] {
        let out = tempfile::tempdir().unwrap();
        let mut t = Tar::new();
        t.pax(keys).file("GNUSparseFile.1/big", b"1\n0\n5\nhello");
        let err = extract_layer(&t.build()[..], out.path(), &Silent).unwrap_err();
        assert_bad_source(err, "sparse file in the pax format");
    }
}

// ---------------------------------------------------------------- hostile archives

#[test]
fn dotdot_entries_are_refused() {
    require_root!();
    for path in ["../x", "../../x", "a/../../../x", "./../etc/passwd"] {
        let world = World::new();
        let mut t = Tar::new();
        t.file(path, b"pwned");
        world.assert_escape_refused(&t.build());
        assert!(!world.path().join("x").exists(), "{path}");
    }
}

#[test]
fn absolute_entries_are_refused() {
    require_root!();
    let world = World::new();
    let target = world.path().join("x");
    let mut t = Tar::new();
    t.file(target.to_str().unwrap(), b"pwned");
    world.assert_escape_refused(&t.build());
    assert!(!target.exists());
}

#[test]
fn entries_through_a_symlink_to_an_absolute_path_are_refused() {
    require_root!();
    let world = World::new();
    let etc = world.path().join("etc");
    let mut t = Tar::new();
    t.symlink("a", etc.to_str().unwrap())
        .file("a/passwd", b"pwned");
    world.assert_escape_refused(&t.build());
    let mut t = Tar::new();
    t.symlink("a", etc.to_str().unwrap())
        .file("a/new", b"pwned");
    world.assert_escape_refused(&t.build());
    assert!(!etc.join("new").exists());
}

#[test]
fn entries_through_a_symlink_going_up_are_refused() {
    require_root!();
    let world = World::new();
    let mut t = Tar::new();
    // layer -> staging -> world
    t.symlink("a", "../..").file("a/x", b"pwned");
    world.assert_escape_refused(&t.build());
    assert!(!world.path().join("x").exists());
    // Deeper, and as a directory entry.
    let mut t = Tar::new();
    t.dir("d/").symlink("d/up", "../../..").dir("d/up/newdir/");
    world.assert_escape_refused(&t.build());
    assert!(!world.path().join("newdir").exists());
}

#[test]
fn entries_through_a_symlink_inside_the_layer_are_refused_too() {
    require_root!();
    let world = World::new();
    let mut t = Tar::new();
    t.dir("real/").symlink("link", "real").file("link/x", b"");
    world.assert_escape_refused(&t.build());
}

#[test]
fn hardlinks_out_of_the_layer_are_refused() {
    require_root!();
    let world = World::new();
    let mut t = Tar::new();
    t.hardlink("h", "../../etc/passwd");
    world.assert_escape_refused(&t.build());
    let absolute = world.path().join("etc/passwd");
    let mut t = Tar::new();
    t.hardlink("h", absolute.to_str().unwrap());
    world.assert_escape_refused(&t.build());
    assert_eq!(lstat(&absolute).nlink(), 1);
}

#[test]
fn hardlinks_through_a_symlink_are_refused() {
    require_root!();
    let world = World::new();
    let etc = world.path().join("etc");
    let mut t = Tar::new();
    t.symlink("s", etc.to_str().unwrap())
        .hardlink("h", "s/passwd");
    world.assert_escape_refused(&t.build());
    let mut t = Tar::new();
    t.symlink("up", "../..").hardlink("h", "up/etc/passwd");
    world.assert_escape_refused(&t.build());
    assert_eq!(lstat(etc.join("passwd")).nlink(), 1);
}

#[test]
fn whiteouts_and_opaque_markers_through_a_symlink_are_refused() {
    require_root!();
    let world = World::new();
    let etc = world.path().join("etc");
    let mut t = Tar::new();
    t.symlink("s", etc.to_str().unwrap())
        .file("s/.wh.passwd", b"");
    world.assert_escape_refused(&t.build());
    let mut t = Tar::new();
    t.symlink("s", etc.to_str().unwrap())
        .file("s/.wh..wh..opq", b"");
    world.assert_escape_refused(&t.build());
    assert_eq!(xattr(&etc, "user.overlay.opaque"), None);
    let mut t = Tar::new();
    t.file(".wh...", b"");
    world.assert_escape_refused(&t.build());
}

#[test]
fn hardlinks_need_an_earlier_non_directory_target() {
    require_root!();
    let out = tempfile::tempdir().unwrap();
    let mut t = Tar::new();
    t.hardlink("h", "later").file("later", b"");
    assert_bad_source(
        extract_layer(&t.build()[..], out.path(), &Silent).unwrap_err(),
        "not earlier in this layer",
    );
    let out = tempfile::tempdir().unwrap();
    let mut t = Tar::new();
    t.dir("d/").hardlink("h", "d");
    assert_bad_source(
        extract_layer(&t.build()[..], out.path(), &Silent).unwrap_err(),
        "is a directory",
    );
}

#[test]
fn parents_that_are_files_are_refused() {
    require_root!();
    let out = tempfile::tempdir().unwrap();
    let mut t = Tar::new();
    t.file("f", b"").file("f/x", b"");
    assert_bad_source(
        extract_layer(&t.build()[..], out.path(), &Silent).unwrap_err(),
        "not a directory",
    );
}

// ---------------------------------------------------------------- corrupt input

#[test]
fn truncated_tars_are_bad_sources() {
    require_root!();
    let mut t = Tar::new();
    t.file("first", &[7u8; 10_000]).file("second", b"2");
    let whole = t.build();
    // Inside the first file's data; and right after it, where the tar crate
    // alone would see a clean end.
    for (cut, mentions) in [(512 + 5_000, "truncated"), (512 + 10_240, "end-of-archive")] {
        let out = tempfile::tempdir().unwrap();
        let err = extract_layer(&whole[..cut], out.path(), &Silent).unwrap_err();
        assert_bad_source(err, mentions);
    }
    let out = tempfile::tempdir().unwrap();
    assert_bad_source(
        extract_layer(&b""[..], out.path(), &Silent).unwrap_err(),
        "end-of-archive",
    );
    // Through unpack, the message names the source.
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("cut.tar");
    fs::write(&source, &whole[..512 + 5_000]).unwrap();
    let staging = new_staging();
    assert_bad_source(
        unpack(&source, staging.path(), &Silent).unwrap_err(),
        source.to_str().unwrap(),
    );
}

#[test]
fn corrupt_compression_is_a_bad_source() {
    require_root!();
    let compressed = gzip(&base_layer());
    let mut flipped = compressed.clone();
    let middle = flipped.len() / 2;
    for byte in &mut flipped[middle..middle + 16] {
        *byte ^= 0x5a;
    }
    let truncated = &compressed[..compressed.len() - 20];
    let mut bad_zstd = zstd(&base_layer());
    let middle = bad_zstd.len() / 2;
    bad_zstd[middle] ^= 0xff;
    bad_zstd.truncate(bad_zstd.len() - 4);
    for (what, bytes) in [
        ("flipped gzip", &flipped[..]),
        ("cut gzip", truncated),
        ("bad zstd", &bad_zstd[..]),
    ] {
        let out = tempfile::tempdir().unwrap();
        let err = extract_layer(bytes, out.path(), &Silent).unwrap_err();
        assert!(matches!(err, ImageError::BadSource(_)), "{what}: {err:?}");
    }
}

#[test]
fn oci_blob_not_matching_its_digest_is_a_bad_source() {
    require_root!();
    let layout = tempfile::tempdir().unwrap();
    write_oci_layout(
        layout.path(),
        &[
            (base_layer(), "application/vnd.oci.image.layer.v1.tar"),
            (upper_layer(), "application/vnd.oci.image.layer.v1.tar"),
        ],
    );
    // Same size, still a valid tar, different content.
    let blob = layout
        .path()
        .join("blobs/sha256")
        .join(sha256(&base_layer()));
    let mut bytes = fs::read(&blob).unwrap();
    let at = bytes.windows(9).position(|w| w == b"brig test").unwrap();
    bytes[at] = b'B';
    fs::write(&blob, bytes).unwrap();
    let staging = new_staging();
    assert_bad_source(
        unpack(layout.path(), staging.path(), &Silent).unwrap_err(),
        "does not match its digest",
    );
}

#[test]
fn oci_missing_blob_is_a_bad_source() {
    require_root!();
    let layout = tempfile::tempdir().unwrap();
    oci_layout(layout.path());
    let upper = layout
        .path()
        .join("blobs/sha256")
        .join(sha256(&zstd(&upper_layer())));
    fs::remove_file(&upper).unwrap();
    let staging = new_staging();
    assert_bad_source(
        unpack(layout.path(), staging.path(), &Silent).unwrap_err(),
        "is missing",
    );
    // The same, inside a tar.
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("image.tar");
    fs::write(&source, tar_of_dir(layout.path())).unwrap();
    let staging = new_staging();
    assert_bad_source(
        unpack(&source, staging.path(), &Silent).unwrap_err(),
        "is missing",
    );
}

#[test]
fn oci_bad_json_is_a_bad_source() {
    let layout = tempfile::tempdir().unwrap();
    oci_layout(layout.path());
    fs::write(layout.path().join("index.json"), b"{\"manifests\": [").unwrap();
    let staging = new_staging();
    assert_bad_source(
        unpack(layout.path(), staging.path(), &Silent).unwrap_err(),
        "index.json: invalid JSON",
    );
}

#[test]
fn oci_manifest_with_a_bad_digest_is_a_bad_source() {
    let layout = tempfile::tempdir().unwrap();
    oci_layout(layout.path());
    fs::write(
        layout.path().join("index.json"),
        br#"{"manifests": [{"digest": "sha256:../../../etc/passwd", "size": 1}]}"#,
    )
    .unwrap();
    let staging = new_staging();
    assert_bad_source(
        unpack(layout.path(), staging.path(), &Silent).unwrap_err(),
        "64 lowercase hex",
    );
}

#[test]
fn docker_layer_not_matching_its_diff_id_is_a_bad_source() {
    require_root!();
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("saved.tar");
    let mut archive = docker_archive(|_| {});
    // Tamper with the first (uncompressed, legacy) layer's file content.
    let at = archive.windows(9).position(|w| w == b"brig test").unwrap();
    archive[at] = b'B';
    fs::write(&source, archive).unwrap();
    let staging = new_staging();
    assert_bad_source(
        unpack(&source, staging.path(), &Silent).unwrap_err(),
        "diff_id",
    );
}

#[test]
fn docker_manifest_without_images_is_a_bad_source() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("saved.tar");
    let mut b = tar::Builder::new(Vec::new());
    append(&mut b, "manifest.json", b"[]");
    fs::write(&source, b.into_inner().unwrap()).unwrap();
    let staging = new_staging();
    assert_bad_source(
        unpack(&source, staging.path(), &Silent).unwrap_err(),
        "lists no images",
    );
}

#[test]
fn not_an_archive_is_a_bad_source() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("notes.txt");
    fs::write(&source, "x".repeat(2048)).unwrap();
    assert_bad_source(detect(&source).unwrap_err(), "notes.txt");
}

// ---------------------------------------------------------------- progress

#[derive(Default)]
struct Recorder {
    phases: Mutex<Vec<(String, Option<u64>)>>,
    bytes: AtomicU64,
}

impl Progress for Recorder {
    fn phase(&self, name: &str, total_bytes: Option<u64>) {
        self.phases
            .lock()
            .unwrap()
            .push((name.to_string(), total_bytes));
    }
    fn advance(&self, bytes: u64) {
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }
}

#[test]
fn progress_names_each_layer_and_counts_bytes() {
    require_root!();
    let layout = tempfile::tempdir().unwrap();
    oci_layout(layout.path());
    let recorder = Recorder::default();
    let staging = new_staging();
    unpack(layout.path(), staging.path(), &recorder).unwrap();
    let phases = recorder.phases.lock().unwrap().clone();
    let sizes = [
        gzip(&base_layer()).len() as u64,
        zstd(&upper_layer()).len() as u64,
    ];
    assert_eq!(
        phases,
        [
            ("unpack layer 1/2".to_string(), Some(sizes[0])),
            ("unpack layer 2/2".to_string(), Some(sizes[1])),
        ]
    );
    let counted = recorder.bytes.load(Ordering::Relaxed);
    assert!(
        counted > 0 && counted <= sizes.iter().sum::<u64>(),
        "{counted}"
    );

    // A plain tar is counted to the byte.
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("rootfs.tar");
    fs::write(&source, base_layer()).unwrap();
    let recorder = Recorder::default();
    let staging = new_staging();
    unpack(&source, staging.path(), &recorder).unwrap();
    assert_eq!(
        recorder.bytes.load(Ordering::Relaxed),
        base_layer().len() as u64
    );
}

struct CancelNow;

impl Progress for CancelNow {
    fn cancelled(&self) -> bool {
        true
    }
}

#[test]
fn cancellation_interrupts() {
    require_root!();
    let out = tempfile::tempdir().unwrap();
    let err = extract_layer(&base_layer()[..], out.path(), &CancelNow).unwrap_err();
    assert!(matches!(err, ImageError::Interrupted), "{err:?}");
    let layout = tempfile::tempdir().unwrap();
    oci_layout(layout.path());
    let staging = new_staging();
    let err = unpack(layout.path(), staging.path(), &CancelNow).unwrap_err();
    assert!(matches!(err, ImageError::Interrupted), "{err:?}");
}
