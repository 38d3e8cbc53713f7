//! OCI image layouts: `oci-layout`, `index.json`, and content-addressed blobs.
//! <https://github.com/opencontainers/image-spec/blob/main/image-layout.md>

use std::collections::HashMap;
use std::path::Path;

use serde::Deserialize;

use super::digest::Digest;
use super::image::{self, LayerBlob};
use super::source::Files;
use super::Unpacked;
use crate::{ImageError, Progress, Result};

/// Indexes pointing to indexes: a few levels are legitimate, endless ones are not.
const MAX_NESTING: usize = 4;

const CONFIG_TYPES: &[&str] = &[
    "application/vnd.oci.image.config.v1+json",
    "application/vnd.docker.container.image.v1+json",
];

const LAYER_TYPES: &[&str] = &[
    "application/vnd.oci.image.layer.v1.tar",
    "application/vnd.oci.image.layer.v1.tar+gzip",
    "application/vnd.oci.image.layer.v1.tar+zstd",
    "application/vnd.oci.image.layer.nondistributable.v1.tar",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd",
    "application/vnd.docker.image.rootfs.diff.tar",
    "application/vnd.docker.image.rootfs.diff.tar.gzip",
];

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Layout {
    image_layout_version: String,
}

/// An index or a manifest: the `mediaType` field is optional in both, so
/// which one it is shows from `manifests` versus `layers`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Document {
    manifests: Option<Vec<Descriptor>>,
    config: Option<Descriptor>,
    layers: Option<Vec<Descriptor>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Descriptor {
    media_type: Option<String>,
    digest: String,
    size: Option<u64>,
    platform: Option<Platform>,
    #[serde(default)]
    annotations: HashMap<String, String>,
}

#[derive(Deserialize)]
struct Platform {
    architecture: String,
    os: String,
}

pub(crate) fn unpack(files: &Files, staging: &Path, progress: &dyn Progress) -> Result<Unpacked> {
    let layout: Layout = files.read_json("oci-layout", None)?;
    if !layout.image_layout_version.starts_with("1.") {
        return Err(ImageError::Unsupported(format!(
            "{}: OCI layout version {} (brig reads 1.x)",
            files.source().display(),
            layout.image_layout_version
        )));
    }
    let mut doc: Document = files.read_json("index.json", None)?;
    let mut name = "index.json".to_string();
    for _ in 0..=MAX_NESTING {
        let Some(manifests) = doc.manifests else {
            return manifest(files, &name, doc, staging, progress);
        };
        let chosen = choose(files, &name, &manifests)?;
        let digest = parse_digest(files, &name, &chosen.digest)?;
        name = digest.to_string();
        doc = files.read_json(&digest.blob_path(), Some(&digest))?;
    }
    Err(files.bad(format!(
        "indexes nested more than {MAX_NESTING} levels deep"
    )))
}

fn manifest(
    files: &Files,
    name: &str,
    doc: Document,
    staging: &Path,
    progress: &dyn Progress,
) -> Result<Unpacked> {
    if name == "index.json" {
        return Err(files.bad("index.json is not an image index (no 'manifests')"));
    }
    let config = doc
        .config
        .ok_or_else(|| files.bad(format!("manifest {name} has no config")))?;
    if let Some(kind) = config
        .media_type
        .as_deref()
        .filter(|t| !CONFIG_TYPES.contains(t))
    {
        return Err(ImageError::Unsupported(format!(
            "{}: manifest {name} is not a container image (config type {kind})",
            files.source().display()
        )));
    }
    let config_digest = parse_digest(files, name, &config.digest)?;
    let config = image::read_config(files, &config_digest.blob_path(), Some(&config_digest))?;

    let mut blobs = Vec::new();
    for layer in doc.layers.unwrap_or_default() {
        if let Some(kind) = layer
            .media_type
            .as_deref()
            .filter(|t| !LAYER_TYPES.contains(t))
        {
            return Err(ImageError::Unsupported(format!(
                "{}: layer {} has media type {kind}, which brig cannot unpack",
                files.source().display(),
                layer.digest
            )));
        }
        let digest = parse_digest(files, name, &layer.digest)?;
        blobs.push(LayerBlob {
            name: digest.blob_path(),
            digest: Some(digest),
            size: layer.size,
        });
    }
    let layers = image::unpack_layers(files, &blobs, &config.diff_ids, staging, progress)?;
    Ok(Unpacked {
        layers,
        config: config.run,
    })
}

/// The manifest to use from an index: the only image in it, or else the one
/// for linux on this machine's architecture.
fn choose<'a>(files: &Files, name: &str, manifests: &'a [Descriptor]) -> Result<&'a Descriptor> {
    let mut images: Vec<&Descriptor> = Vec::new();
    for descriptor in manifests.iter().filter(|d| !is_attestation(d)) {
        // docker save lists the same manifest once per tag.
        if !images.iter().any(|seen| seen.digest == descriptor.digest) {
            images.push(descriptor);
        }
    }
    if let [only] = images[..] {
        return Ok(only);
    }
    if images.is_empty() {
        return Err(files.bad(format!("{name} lists no image manifests")));
    }
    let arch = host_architecture();
    let matching: Vec<&Descriptor> = images
        .iter()
        .copied()
        .filter(|d| {
            d.platform
                .as_ref()
                .is_some_and(|p| p.os == "linux" && p.architecture == arch)
        })
        .collect();
    match matching[..] {
        [one] => Ok(one),
        _ => {
            let platforms: Vec<String> = images
                .iter()
                .map(|d| match &d.platform {
                    Some(p) => format!("{}/{}", p.os, p.architecture),
                    None => "unspecified".to_string(),
                })
                .collect();
            Err(files.bad(format!(
                "{name} lists {} images and {} of them are for linux/{arch}, cannot choose (platforms: {})",
                images.len(),
                matching.len(),
                platforms.join(", ")
            )))
        }
    }
}

/// BuildKit stores provenance and SBOMs as extra manifests with platform
/// unknown/unknown; they are not images.
fn is_attestation(descriptor: &Descriptor) -> bool {
    descriptor
        .annotations
        .get("vnd.docker.reference.type")
        .is_some_and(|t| t == "attestation-manifest")
        || descriptor
            .platform
            .as_ref()
            .is_some_and(|p| p.os == "unknown" && p.architecture == "unknown")
}

/// This machine's architecture, spelled as OCI platforms spell it (Go's GOARCH).
fn host_architecture() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "x86" => "386",
        "aarch64" => "arm64",
        "powerpc64" if cfg!(target_endian = "little") => "ppc64le",
        "loongarch64" => "loong64",
        other => other,
    }
}

fn parse_digest(files: &Files, name: &str, text: &str) -> Result<Digest> {
    Digest::parse(text).map_err(|e| files.bad(format!("{name}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn descriptor(digest: &str, platform: Option<(&str, &str)>) -> Descriptor {
        Descriptor {
            media_type: None,
            digest: digest.to_string(),
            size: None,
            platform: platform.map(|(os, arch)| Platform {
                os: os.to_string(),
                architecture: arch.to_string(),
            }),
            annotations: HashMap::new(),
        }
    }

    fn files() -> Files {
        Files::dir(Path::new("/")).unwrap()
    }

    #[test]
    fn the_only_image_wins_whatever_its_platform() {
        let list = [
            descriptor("sha256:a", Some(("linux", "s390x"))),
            descriptor("sha256:b", Some(("unknown", "unknown"))),
            descriptor("sha256:a", Some(("linux", "s390x"))),
        ];
        assert_eq!(
            choose(&files(), "index.json", &list).unwrap().digest,
            "sha256:a"
        );
    }

    #[test]
    fn several_images_pick_this_machine() {
        let arch = host_architecture();
        let list = [
            descriptor("sha256:a", Some(("linux", "not-this-one"))),
            descriptor("sha256:b", Some(("linux", arch))),
            descriptor("sha256:c", Some(("windows", arch))),
        ];
        assert_eq!(
            choose(&files(), "index.json", &list).unwrap().digest,
            "sha256:b"
        );
    }

    #[test]
    fn ambiguity_is_an_error() {
        let arch = host_architecture();
        let two = [
            descriptor("sha256:a", Some(("linux", arch))),
            descriptor("sha256:b", Some(("linux", arch))),
        ];
        let none = [descriptor("sha256:a", None), descriptor("sha256:b", None)];
        for list in [&two[..], &none[..], &[]] {
            let err = choose(&files(), "index.json", list).err().unwrap();
            assert!(matches!(err, ImageError::BadSource(_)), "{err}");
        }
    }
}
